"""Backend report on this machine's real llama.cpp build, and the advice for other machines."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from app import gpu_advice
from app.gpu_advice import SystemGpu

REPO = Path(__file__).resolve().parents[2]


def test_this_build_reports_its_backends() -> None:
    from engine.native import llama_lib

    report = gpu_advice.check()
    assert "CPU" in report.backends
    assert report.can_offload == llama_lib.supports_gpu_offload()
    if not report.can_offload:
        assert report.summary == "CPU only"
        assert report.gpu_backends == ()
    # Advice appears exactly when there is a GPU this build cannot use, or AMX kernels it
    # cannot use.
    gpu_unused = bool(report.system_gpus) and not report.can_offload
    amx_unused = llama_lib.amx_build() and not llama_lib.amx_kernels_safe()
    assert bool(report.advice) == (gpu_unused or amx_unused)


def test_unusable_amx_kernels_get_rebuild_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.native import llama_lib

    monkeypatch.setattr(llama_lib, "amx_build", lambda: True)
    monkeypatch.setattr(llama_lib, "amx_kernels_safe", lambda: False)
    (line,) = gpu_advice.amx_advice()
    assert "AMX" in line and "`make setup GPU=cpu`" in line
    assert "`make dist`" in gpu_advice.amx_advice(frozen=True)[0]
    monkeypatch.setattr(llama_lib, "amx_kernels_safe", lambda: True)
    assert gpu_advice.amx_advice() == ()
    monkeypatch.setattr(llama_lib, "amx_build", lambda: False)
    monkeypatch.setattr(llama_lib, "amx_kernels_safe", lambda: False)
    assert gpu_advice.amx_advice() == ()


@pytest.mark.parametrize(
    ("vendor", "choice", "flag"),
    [
        ("NVIDIA", "cuda", "-DGGML_CUDA=on"),
        ("Apple", "metal", "-DGGML_METAL=on"),
        ("AMD", "vulkan", "-DGGML_VULKAN=on"),
        ("Intel", "vulkan", "-DGGML_VULKAN=on"),
    ],
)
def test_cpu_build_with_a_gpu_gets_the_matching_build(vendor: str, choice: str, flag: str) -> None:
    lines = gpu_advice.advise(("CPU",), False, [SystemGpu(vendor, "a card")])
    text = "\n".join(lines)
    assert "CPU only" in lines[0]
    assert f"make setup GPU={choice}" in text
    assert f'CMAKE_ARGS="{flag}"' in text
    # Without these pip reinstalls its cached CPU wheel of the same version.
    assert "--no-cache-dir --force-reinstall" in text


def test_no_advice_when_build_matches() -> None:
    assert gpu_advice.advise(("CUDA", "CPU"), True, [SystemGpu("NVIDIA", "x")]) == ()
    assert gpu_advice.advise(("CPU",), False, []) == ()


def test_bundle_advice_points_to_a_gpu_bundle_build() -> None:
    text = "\n".join(gpu_advice.advise(("CPU",), False, [SystemGpu("NVIDIA", "x")], frozen=True))
    assert "make setup GPU=cuda" in text and "make dist" in text
    assert "pip install" not in text


def test_summary_names_gpu_backends() -> None:
    report = gpu_advice.BackendReport(("CUDA", "CPU"), True)
    assert report.summary == "GPU offload: CUDA"


def test_sysfs_pci_vendors_are_read(tmp_path: Path) -> None:
    for card, vendor in (("card0", "0x1234"), ("card1", "0x10de"), ("card2", "0x1002")):
        (tmp_path / card / "device").mkdir(parents=True)
        (tmp_path / card / "device" / "vendor").write_text(vendor + "\n")
    (tmp_path / "card1-HDMI-A-1" / "device").mkdir(parents=True)  # a connector: ignored
    (tmp_path / "card1-HDMI-A-1" / "device" / "vendor").write_text("0x10de\n")
    gpus = gpu_advice.system_gpus(tmp_path, platform_name="linux")
    vendors = [g.vendor for g in gpus]
    assert vendors.count("AMD") == 1 and vendors.count("NVIDIA") == 1
    assert "0x1234" not in str(gpus)  # an emulated VGA adapter is no GPU


def test_apple_silicon_counts_as_a_gpu() -> None:
    assert gpu_advice.system_gpus(platform_name="darwin", machine="arm64")[0].vendor == "Apple"
    assert gpu_advice.system_gpus(platform_name="darwin", machine="x86_64") == []


def test_makefile_builds_what_the_advice_says() -> None:
    """`make setup GPU=x` and the advice must name the same CMake flags and version."""
    makefile = (REPO / "Makefile").read_text()
    for choice, flag in gpu_advice.CMAKE_ARGS.items():
        m = re.search(rf"^CMAKE_ARGS_{choice} :=(.*)$", makefile, re.MULTILINE)
        assert m is not None and m.group(1).strip() == flag
    assert f"llama-cpp-python=={gpu_advice.LLAMA_CPP_VERSION}" in makefile
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"llama-cpp-python=={gpu_advice.LLAMA_CPP_VERSION}"' in pyproject


def test_make_setup_rejects_an_unknown_gpu(tmp_path: Path) -> None:
    # A throw-away venv path whose install stamp is up to date, so make runs only the GPU step;
    # the choice is checked before pip is called.
    llama_stamp = tmp_path / "llama-stamp"
    llama_stamp.touch()
    stamp = tmp_path / "stamp"
    stamp.touch()
    r = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(REPO),
            f"VENV={tmp_path}",
            f"STAMP={stamp}",
            f"LLAMA_STAMP={llama_stamp}",
            f"{tmp_path}/.candlewick-gpu-opencl",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode != 0
    assert "GPU must be one of: cpu cuda metal vulkan (got 'opencl')" in r.stdout
    assert not (tmp_path / ".candlewick-gpu-opencl").exists()
