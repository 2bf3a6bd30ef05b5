"""GLSL -> SPIR-V. Variants come from shaders/variants.toml; each is compiled by glslc with its
defines into a cache keyed by a hash of the sources, the defines and the compiler version: once
optimized (the kernel) and once as is, keeping the debug names that tell the push-constant
block's member names (worker/engine/vk/spirv.py)."""
import hashlib
import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from vkllm.errors import VkllmError
from worker.engine.vk.spirv import PushLayout, push_layout
from worker.engine.weight_types import WEIGHT_TYPES

SHADER_DIR = Path(__file__).resolve().parents[2] / "shaders"


class ShaderBuildError(VkllmError):
    pass


@dataclass(frozen=True)
class Variant:
    name: str
    source: str
    defines: tuple[tuple[str, str], ...]
    bindings: int


@dataclass(frozen=True)
class Shader:
    """A compiled variant: the kernel's SPIR-V, its storage-buffer count and push-constant block."""
    variant: Variant
    spirv: bytes
    push: PushLayout


def _expand(op: str, entry: dict) -> list[Variant]:
    """One entry of the table: a plain kernel, or one variant per weight type (`weight_types`)."""
    base = tuple(sorted((k, str(v)) for k, v in entry.get("defines", {}).items()))
    if not entry.get("weight_types"):
        return [Variant(op, entry["source"], base, entry["bindings"])]
    return [Variant(f"{op}_{t.name.lower()}", entry["source"], base + ((f"DATA_A_{t.name}", "1"),),
                    entry["bindings"]) for t in WEIGHT_TYPES]


@cache
def variants() -> dict[str, Variant]:
    table = tomllib.loads((SHADER_DIR / "variants.toml").read_text())
    return {v.name: v for op, entry in table.items() for v in _expand(op, entry)}


@cache
def _glslc() -> tuple[str, str]:
    path = shutil.which("glslc")
    if path is None:
        raise ShaderBuildError("glslc (the GLSL compiler) is missing: install the 'glslc' package")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    return path, version.splitlines()[0]


@cache
def _sources_digest() -> str:
    """Every shader file takes part: an include may change what any entry point compiles to."""
    h = hashlib.sha256()
    for f in sorted(SHADER_DIR.glob("*.comp")) + sorted(SHADER_DIR.glob("*.glsl")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def spirv_path(variant: Variant, cache_dir: Path) -> Path:
    """The optimized kernel; its unoptimized twin, with debug names, is `named_path` of it."""
    glslc, version = _glslc()
    key = hashlib.sha256(repr((variant, version, _sources_digest())).encode()).hexdigest()[:24]
    out = cache_dir / "spirv" / f"{variant.name}-{key}.spv"
    if out.exists() and named_path(out).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    _compile(glslc, variant, named_path(out), [])
    _compile(glslc, variant, out, ["-O"])
    return out


def named_path(spirv: Path) -> Path:
    return spirv.with_suffix(".names.spv")


def _compile(glslc: str, variant: Variant, out: Path, options: list[str]):
    # a temporary name of this process's own: workers sharing the cache may compile the same kernel at once
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [glslc, "--target-env=vulkan1.2", "-fshader-stage=compute", *options, "-I", str(SHADER_DIR),
           *[f"-D{k}={v}" for k, v in variant.defines], str(SHADER_DIR / variant.source), "-o", str(tmp)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ShaderBuildError(f"compiling {variant.name} failed:\n{result.stderr.strip()}")
    tmp.replace(out)


def load_spirv(name: str, cache_dir: Path) -> Shader:
    try:
        variant = variants()[name]
    except KeyError:
        raise ShaderBuildError(f"no shader variant named '{name}' in shaders/variants.toml") from None
    path = spirv_path(variant, cache_dir)
    spirv = path.read_bytes()
    return Shader(variant, spirv, push_layout(name, spirv, named_path(path).read_bytes()))


def build_all(cache_dir: Path) -> list[Path]:
    return [spirv_path(v, cache_dir) for v in variants().values()]
