"""Paths the tests share: the repository, its example manifests and the lab guest's fixture tree."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
LAB = EXAMPLES / "lab.yaml"
CPU_DEMO = EXAMPLES / "cpu-demo.yaml"
LAB_GUEST = REPO / "tests" / "fixtures" / "lab-guest"
