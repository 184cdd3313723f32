"""The suite keeps to its temporary folders: every cache a test can touch points into one."""

import os
import tempfile
from pathlib import Path

import fwdtrain as ft


def test_every_cache_of_a_test_is_in_a_temporary_folder(tmp_path, own_cache_folder):
    assert ft.compile.cache.cache_dir() == own_cache_folder and own_cache_folder.parent == tmp_path.parent
    temporary = Path(tempfile.gettempdir()).resolve()
    home = Path(os.path.expanduser("~")).resolve()
    for name in ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR"):
        folder = Path(os.environ[name]).resolve()
        assert folder.is_relative_to(temporary), f"{name} = {folder} is outside {temporary}"
        assert temporary.is_relative_to(home) or not folder.is_relative_to(home), f"{name} = {folder} is in HOME"
