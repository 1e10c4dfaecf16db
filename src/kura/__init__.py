"""kura: a build-cache node that speaks each build tool's own remote-cache protocol.

Layers (enforced by import-linter, see pyproject.toml): ``core`` holds pure rules and values,
``storage`` owns files and SQLite, ``mesh`` talks to peers, ``api`` speaks the client protocols,
``app`` composes them and ``cli`` turns argv and environment into settings.
"""

__version__ = "0.2.0"
