"""A machine without a Vulkan driver or loader gets one line naming what to install."""
import subprocess
import sys


def _vkllm(*args, env_extra=None, pythonpath=None):
    import os
    env = {**os.environ, **(env_extra or {})}
    if pythonpath:
        env["PYTHONPATH"] = f"{pythonpath}:{env.get('PYTHONPATH', '')}"
    return subprocess.run([sys.executable, "-m", "vkllm.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_no_driver_names_the_package(tmp_path):
    missing = str(tmp_path / "none.json")
    result = _vkllm("devices", env_extra={"VK_DRIVER_FILES": missing, "VK_ICD_FILENAMES": missing})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "mesa-vulkan-drivers" in lines[0] and "Traceback" not in result.stderr


def test_no_loader_names_the_package(tmp_path):
    # cffi raises OSError when libvulkan.so.1 cannot be opened: stand that in for the package.
    fake = tmp_path / "vulkan"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('cannot load library libvulkan.so.1')\n")
    result = _vkllm("devices", pythonpath=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "libvulkan1" in lines[0]
