"""The schema's NNNN_name.sql files, installed as the package `bus.migrations`.

A package so that the code finds them one way, by importing it, both in a
checkout (setup.cfg's package_dir maps it here) and in a wheel (bus/migrations/).
"""
