"""Which model an experiment's Hugging Face id names: a catalog entry, else a config.json under a
`--models` folder (read by replay/model/hf/config.py when the fleet is planned)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from replay.model.models import MODELS

INSTRUCT = "-Instruct"
# A Hugging Face repository id: "org/name" of letters, digits, '-', '_' and '.' (never '..'), so a
# lookup stays inside --models.
REPO_ID = re.compile(r"(?:[A-Za-z0-9_.-]+/)?[A-Za-z0-9_.-]+")


def catalog_id(model_hf: str) -> str | None:
    """The catalog entry whose `hf_repo` is `model_hf` (case aside); else the entry of its base
    model when `model_hf` is an instruct tune (`...-Instruct`), which keeps the base's config.json in
    every field the replay reads (Llama-3.1-8B/70B-Instruct: tests/unit/test_measured.py checks it)."""
    by_repo = {spec.hf_repo.lower(): model_id for model_id, spec in MODELS.items()}
    wanted = model_hf.lower()
    if wanted in by_repo:
        return by_repo[wanted]
    if wanted.endswith(INSTRUCT.lower()):
        return by_repo.get(wanted[: -len(INSTRUCT)])
    return None


def config_candidates(model_hf: str, models_dir: Path) -> list[Path]:
    """Where a config.json of `model_hf` ("org/Name") may sit under `models_dir`: a folder named
    after the repository (lower-cased, as ../shared/models/ names them, or as spelled) or the
    org/name tree a Hugging Face download leaves."""
    if not REPO_ID.fullmatch(model_hf) or any(part in (".", "..") for part in model_hf.split("/")):
        return []
    name = model_hf.rsplit("/", 1)[-1]
    folders = [name.lower(), name, *([model_hf] if "/" in model_hf else [])]
    out: list[Path] = []
    for folder in folders:
        candidate = models_dir / folder / "config.json"
        if candidate not in out:
            out.append(candidate)
    return out


def resolve_model(model_hf: str, models_dir: Path | None, fail: Callable[[str], Exception]) -> str:
    """A fleet config's `model:` for `model_hf`: its catalog id, or the path of its config.json under
    `models_dir`; else `fail(expected)` is raised (the caller names the file and row)."""
    found = catalog_id(model_hf)
    if found is not None:
        return found
    looked = ""
    if models_dir is not None:
        candidates = config_candidates(model_hf, models_dir)
        for path in candidates:
            if path.is_file():
                return str(path.resolve())
        looked = ("; no config.json at " + ", ".join(str(p) for p in candidates) if candidates
                  else "; not a Hugging Face id (org/name), so not looked up under --models")
    hint = looked or "; pass --models DIR, a folder holding <name>/config.json for models the catalog lacks"
    raise fail(f"a model of the catalog (llm-replay catalog lists them by Hugging Face id){hint}")
