"""Dataset readers: each turns a folder (or a built-in scene) into a Scene, with its own config section."""
