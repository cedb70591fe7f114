"""Content-addressed storage for payloads too large for a message row.

Built in a later issue; the package exists so the layout is fixed from the start.
"""
