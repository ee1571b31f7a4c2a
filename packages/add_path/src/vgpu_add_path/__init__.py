"""libadd_path.so: rewrite PATH, LD_PRELOAD and LD_LIBRARY_PATH from TF_* variables on load."""

from vgpu_add_path._library import SEPARATORS, library_path, merge

__all__ = ["SEPARATORS", "library_path", "merge"]
