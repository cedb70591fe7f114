"""Storage: the database file (connections, pragmas, the header), its schema and
migrations, its integrity check, the errors every part raises, and the bus's
view of the files beside it (blobs, failed writes).

Imports nothing: a module of the room is loaded only by whoever imports it.
"""
