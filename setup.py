"""Package metadata and dependencies for megatron_energy."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def _config_files(folder: str) -> list[str]:
    """Return the YAML files under ``configs/<folder>`` relative to the repository root."""
    return sorted(str(p.relative_to(HERE)) for p in (HERE / "configs" / folder).glob("*.yaml"))


setup(
    name="megatron-energy",
    version="0.1.0",
    description="Energy optimisation plugins for Megatron-LM training: same throughput, less GPU energy.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.12",
    packages=find_packages(include=["megatron_energy", "megatron_energy.*"]),
    package_data={"megatron_energy": ["py.typed"]},
    data_files=[
        ("share/megatron_energy/configs/gpus", _config_files("gpus")),
        ("share/megatron_energy/configs/examples", _config_files("examples")),
        (
            "share/megatron_energy/patches/megatron-core-0.19",
            sorted(
                str(p.relative_to(HERE)) for p in (HERE / "patches" / "megatron-core-0.19").glob("*.patch")
            ),
        ),
    ],
    install_requires=[
        "torch>=2.7",  # profile_all_threads: the kernel timeline's profiler stops off the training thread
        "megatron-core>=0.19,<0.20",
        "nvidia-ml-py>=12.535",
        "zeus>=0.16,<0.17",
        "pydantic>=2.6,<3",  # the plan file's schema (plan_file.py); zeus installs it too
        "networkx>=3.2",
        "numpy>=1.26",
        "scipy>=1.15",
        "optuna>=4.0",  # multi-objective search of collective schedules (optimisers/kareus/search.py)
        "matplotlib>=3.8",
        "rich>=13",
        "pyyaml>=6",
        "tensorboard>=2.15",  # Megatron's --tensorboard-dir writer, which the energy scalars go to too
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytest-xdist>=3.6",
            "ruff>=0.6",
            "mypy>=1.11",
            "types-PyYAML",
            "lowtime==0.3.0",
            "mkdocs-material>=9.5,<10",  # the docs site (mkdocs.yml), built strictly by scripts/test.sh
            "mkdocstrings[python]>=0.29",
        ],
    },
    entry_points={"console_scripts": ["megatron-energy=megatron_energy.cli:main"]},
)
