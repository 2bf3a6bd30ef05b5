"""GLSL -> SPIR-V. Variants come from shaders/variants.toml; each is compiled with its defines,
by the first compiler that supports what it `requires` (worker/engine/compilers.py), into a cache
keyed by a hash of the sources, the defines and the compiler version: once optimized (the kernel)
and once as is, keeping the debug names that tell the push-constant block's member names
(worker/engine/vk/spirv.py)."""
import hashlib
import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from worker.engine import compilers
from worker.engine.compilers import ShaderBuildError
from worker.engine.vk.spirv import PushLayout, push_layout
from worker.engine.weight_types import QUANTIZED_TYPES, WEIGHT_TYPES

SHADER_DIR = Path(__file__).resolve().parents[2] / "shaders"


@dataclass(frozen=True)
class Variant:
    name: str
    source: str
    defines: tuple[tuple[str, str], ...]
    bindings: int
    requires: tuple[str, ...] = ()   # compiler features (compilers.FEATURES) beyond plain GLSL 4.50


@dataclass(frozen=True)
class Shader:
    """A compiled variant: the kernel's SPIR-V, its storage-buffer count and push-constant block."""
    variant: Variant
    spirv: bytes
    push: PushLayout


def _expand(op: str, entry: dict) -> list[Variant]:
    """One entry of the table: a plain kernel, or one variant per weight type (`weight_types`:
    true, every type; "quantized", the quantized ones; or a list of type names), each once per
    column count of `columns` if it has them, and once per subset of its `options` ([suffix,
    define, extra bindings] each: <op>[_suffix]..., in the table's order)."""
    base = tuple(sorted((k, str(v)) for k, v in entry.get("defines", {}).items()))
    requires = tuple(entry.get("requires", ()))
    unknown = set(requires) - set(compilers.FEATURES)
    if unknown:
        raise ShaderBuildError(f"variants.toml: {op} requires unknown features {sorted(unknown)}")
    if "options" in entry:
        variants = [(op, entry)]
        for suffix, define, bindings in entry["options"]:
            variants += [(f"{name}_{suffix}", e | {"defines": e.get("defines", {}) | {define: 1},
                                                   "bindings": e["bindings"] + bindings}) for name, e in variants]
        return [v for name, e in variants for v in _expand(name, {k: x for k, x in e.items() if k != "options"})]
    if "columns" in entry:   # one entry per column count: <op>_c<N>, define COLS=N
        rest = {k: v for k, v in entry.items() if k != "columns"}
        return [v for n in entry["columns"]
                for v in _expand(f"{op}_c{n}", rest | {"defines": entry.get("defines", {}) | {"COLS": n}})]
    types = entry.get("weight_types")
    if not types:
        return [Variant(op, entry["source"], base, entry["bindings"], requires)]
    if types is True:
        types = [t.name for t in WEIGHT_TYPES]
    elif types == "quantized":
        types = [t.name for t in QUANTIZED_TYPES]
    unknown = set(types) - {t.name for t in WEIGHT_TYPES}
    if unknown:
        raise ShaderBuildError(f"variants.toml: {op} lists unknown weight types {sorted(unknown)}")
    return [Variant(f"{op}_{name.lower()}", entry["source"], base + ((f"DATA_A_{name}", "1"),),
                    entry["bindings"], requires) for name in types]


@cache
def variants() -> dict[str, Variant]:
    table = tomllib.loads((SHADER_DIR / "variants.toml").read_text())
    return {v.name: v for op, entry in table.items() for v in _expand(op, entry)}


@cache
def _sources_digest() -> str:
    """Every shader file takes part: an include may change what any entry point compiles to."""
    h = hashlib.sha256()
    for f in sorted(SHADER_DIR.glob("*.comp")) + sorted(SHADER_DIR.glob("*.glsl")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def spirv_path(variant: Variant, cache_dir: Path) -> Path:
    """The optimized kernel; its unoptimized twin, with debug names, is `named_path` of it."""
    compiler = compilers.choose(variant.name, variant.requires, compilers.available())
    key = hashlib.sha256(repr((variant, compiler.version, _sources_digest())).encode()).hexdigest()[:24]
    out = cache_dir / "spirv" / f"{variant.name}-{key}.spv"
    if out.exists() and named_path(out).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    _compile(compiler, variant, named_path(out), optimized=False)
    _compile(compiler, variant, out, optimized=True)
    return out


def named_path(spirv: Path) -> Path:
    return spirv.with_suffix(".names.spv")


def _compile(compiler: compilers.Compiler, variant: Variant, out: Path, optimized: bool):
    # a temporary name of this process's own: workers sharing the cache may compile the same kernel at once
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    result = compiler.run(compiler.compile_args(SHADER_DIR / variant.source, SHADER_DIR, variant.defines, tmp,
                                                optimized))
    if result.returncode != 0:
        # glslangValidator reports errors on stdout
        raise ShaderBuildError(f"compiling {variant.name} with {compiler.name} failed:\n"
                               f"{(result.stderr + result.stdout).strip()}")
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
