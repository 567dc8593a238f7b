"""Every name a module exports in ``__all__`` exists in it: a rename that misses the list breaks
``from module import *`` and the docs' API tables without any other test noticing."""

import importlib
import pkgutil

import pytest

import attnscale

OPTIONAL = ("ray", "lightning", "transformers", "wandb", "tensorboard", "playwright")  # extras not installed


def _modules():
    return [m.name for m in pkgutil.walk_packages(attnscale.__path__, "attnscale.") if not m.name.endswith("__main__")]


@pytest.mark.parametrize("name", _modules())
def test_every_exported_name_exists(name):
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        if any(extra in str(e) for extra in OPTIONAL):
            pytest.skip(f"{name} needs an extra: {e}")
        raise
    missing = [n for n in getattr(module, "__all__", []) if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"
