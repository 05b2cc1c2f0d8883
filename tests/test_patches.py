"""``torch_rbln/patches.py``: every change to PyTorch's own objects in one place, and the ABI
handshake's hook list (``abi.HOOKS``) derived from it, complete for what the package uses.
(``tests/test_diagnose.py`` checks ``torch.x._y`` chains and imports; these tests check what a
text scan cannot see: private attributes of torch objects and overridden private members.)"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import re

import pytest
import torch

import torch_rbln
from conftest import ROOT

PKG = ROOT / "torch_rbln"
_STDLIB_PRIVATE = {"_getframe"}      # sys._getframe


def _sources():
    for path in sorted(PKG.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def _resolve(path: str):
    from torch_rbln import abi
    return abi.resolve(path)


def test_hooks_are_the_patches_and_the_private_names():
    from torch_rbln import abi, patches
    targets = [t for p in patches.PATCHES for t in p.targets]
    assert [h.path for h in abi.HOOKS] == targets + [h.path for h in patches.PRIVATE + patches.SCOPED]
    assert len(set(targets)) == len(targets)


def test_scoped_cuda_names_are_rbln_inside_only():
    from torch_rbln import patches
    before = {n: getattr(torch.cuda, n) for n in patches.CUDA_AS_RBLN}
    with patches.cuda_names_as_rbln():
        assert all(getattr(torch.cuda, n) is getattr(torch.rbln, n) for n in patches.CUDA_AS_RBLN)
        s = torch.cuda.Stream()
        assert s.device.type == "rbln"
    with pytest.raises(RuntimeError, match="boom"), patches.cuda_names_as_rbln():
        raise RuntimeError("boom")
    assert {n: getattr(torch.cuda, n) for n in patches.CUDA_AS_RBLN} == before


def test_every_patch_is_in_effect():
    for p in torch_rbln.patches.PATCHES:
        for target in p.targets:
            obj = _resolve(target)
            assert getattr(obj, "__module__", None) == "torch_rbln.patches", target


def test_nothing_outside_patches_assigns_to_torch():
    offenders = []
    for path, tree in _sources():
        if path.name == "patches.py":
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in targets:
                root = t
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(t, ast.Attribute) and isinstance(root, ast.Name) and root.id == "torch":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "setattr" and node.args
                    and isinstance(node.args[0], ast.Attribute)):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} (setattr)")
    assert not offenders, f"patch PyTorch in torch_rbln/patches.py only: {offenders}"


def _defined_here() -> set[str]:
    """Every name the package itself defines (functions, classes, variables, attributes it
    assigns, __slots__, arguments, modules) and every binding of the native core."""
    names = {p.stem for p in PKG.rglob("*.py")} | {"_C"}
    for _, tree in _sources():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                names.add(n.attr)
            elif isinstance(n, ast.arg):
                names.add(n.arg)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                names.add(n.value)          # __slots__ entries, getattr(x, "_name") defaults
    for cpp in (PKG / "csrc").glob("*.cpp"):
        names.update(re.findall(r'm\.def\("(\w+)"', cpp.read_text()))
    return names


def test_private_attributes_of_torch_objects_are_listed():
    """``op._schema``, ``t._base``, ``OpOverload._handle``...: a private attribute the package
    reads that it does not define itself belongs to torch, so a hook must name it."""
    from torch_rbln import abi, vllm_plugin
    listed = {part for h in abi.HOOKS for part in h.path.split(".")}
    ours = _defined_here()
    missing = set()
    for path, tree in _sources():
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)):
                continue
            a = n.attr
            if (not a.startswith("_") or a.startswith("__") or a in ours or a in listed
                    or a in _STDLIB_PRIVATE or hasattr(torch.ops.aten, a)):
                continue
            if "vllm_plugin" in path.parts and a in vllm_plugin.VLLM_PRIVATE:
                continue                      # vLLM's, listed by the plugin
            missing.add(f"{a} ({path.relative_to(ROOT)}:{n.lineno})")
    assert not missing, f"add hooks for these to torch_rbln/patches.py PRIVATE: {sorted(missing)}"


def test_overridden_private_torch_members_are_listed():
    """A subclass of a torch class that overrides a private member (``_should_skip_dynamo``)
    relies on it as much as a patch does."""
    from torch_rbln import abi
    listed = {h.path for h in abi.HOOKS}
    missing = []
    for info in pkgutil.walk_packages([str(PKG)], "torch_rbln."):
        if info.name in ("torch_rbln._C", "torch_rbln.__main__"):
            continue
        if info.name.startswith("torch_rbln.vllm_plugin.") and importlib.util.find_spec("vllm") is None:
            continue                          # the plugin's modules import vLLM (an extra)
        mod = importlib.import_module(info.name)
        for cls in vars(mod).values():
            if not (inspect.isclass(cls) and cls.__module__ == mod.__name__):
                continue
            for base in cls.__mro__[1:]:
                if not base.__module__.startswith("torch") or base.__module__.startswith("torch_rbln"):
                    continue
                for name, member in vars(cls).items():
                    written = inspect.isfunction(member) or isinstance(
                        member, (classmethod, staticmethod, property))    # not metaclass-made
                    if (written and name.startswith("_") and not name.startswith("__")
                            and hasattr(base, name)):
                        if not any(p.endswith(f".{base.__name__}.{name}") for p in listed):
                            missing.append(f"{base.__module__}.{base.__name__}.{name} "
                                           f"(overridden in {cls.__module__}.{cls.__name__})")
    assert not missing, f"add hooks for these to torch_rbln/patches.py PRIVATE: {sorted(set(missing))}"
