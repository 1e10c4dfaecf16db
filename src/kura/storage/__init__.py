"""Everything that touches files and SQLite: blobs on disk, the metadata index, tmp staging."""
