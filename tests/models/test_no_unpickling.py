"""No code path unpickles: checkpoints load from safetensors and GGUF only. This reads the
source of every package and script and refuses `pickle`/`dill`/`joblib`/`cloudpickle`
loads, `torch.load` without `weights_only=True`, `numpy.load` with `allow_pickle=True`, and
`torch.jit.load` / `torch.package` (both unpickle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "strategies", "kernels", "workloads", "reports", "scripts")
PICKLERS = {"pickle", "dill", "joblib", "cloudpickle", "shelve", "marshal"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _keyword(call: ast.Call, name: str) -> object:
    for keyword in call.keywords:
        if keyword.arg == name and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return None


def unpickling_calls(source: str) -> list[str]:
    """Each call in `source` that can unpickle, as `line: call`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                modules.append(node.module or "")
            found += [f"{node.lineno}: import {m}" for m in modules if m.split(".")[0] in PICKLERS]
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        bad = (
            (name.endswith("torch.load") and _keyword(node, "weights_only") is not True)
            or (name.endswith(("np.load", "numpy.load")) and _keyword(node, "allow_pickle"))
            or name.endswith(("torch.jit.load", "package.PackageImporter"))
            or name.split(".")[0] in PICKLERS
        )
        if bad:
            found.append(f"{node.lineno}: {name}")
    return found


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("import torch\ntorch.load('x.pt')", True),
        ("import torch\ntorch.load('x.pt', weights_only=False)", True),
        ("import torch\ntorch.load('x.pt', weights_only=True)", False),
        ("import pickle\npickle.loads(b'')", True),
        ("import numpy as np\nnp.load('x.npy', allow_pickle=True)", True),
        ("import numpy as np\nnp.load('x.npy')", False),
        ("from safetensors.torch import load_file\nload_file('x')", False),
    ],
)
def test_the_scan_catches_each_way_of_unpickling(source: str, caught: bool) -> None:
    assert bool(unpickling_calls(source)) is caught


def test_no_source_file_unpickles() -> None:
    offenders = {
        str(path.relative_to(ROOT)): calls
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (calls := unpickling_calls(path.read_text()))
    }
    assert offenders == {}


def test_a_pickled_checkpoint_is_refused_unopened(tmp_path: Path) -> None:
    """A folder holding only `pytorch_model.bin` (a pickle that would leave a marker file if
    it were ever unpickled) is refused with one line naming the field; nothing runs."""
    import json
    import pickle

    from servelab.base.errors import ConfigError
    from servelab.models.dummy import DUMMY_SHAPES
    from servelab.models.hf_folder import hf_config_dict
    from servelab.models.load import load_model
    from servelab.models.spec import model_spec

    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_config_dict(DUMMY_SHAPES["tiny"])))
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    import torch
    from omegaconf import OmegaConf

    node = OmegaConf.create({"name": "hf", "source": "hf", "path": str(folder)})
    with pytest.raises(ConfigError, match=r"model.path: .* has no \*.safetensors files"):
        load_model(model_spec(node, tmp_path), torch.float32, torch.device("cpu"))
    assert not marker.exists()
