"""The resources layer (``ebrl/resources``) knows stages only through the callables it is given:
none of its modules imports a policy, an algorithm, an env, a stage or a scheduler, at the top or
inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import ebrl.resources

FORBIDDEN = ("ebrl.algos", "ebrl.policies", "ebrl.envs", "ebrl.stages", "ebrl.schedulers")


def imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


def test_the_resources_layer_imports_no_policy_algorithm_env_or_scheduler() -> None:
    root = Path(ebrl.resources.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 10  # the package itself, not an empty folder
    bad = {
        str(f.relative_to(root)): m for f in files for m in imports(f) if m.startswith(FORBIDDEN)
    }
    assert bad == {}


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from ebrl.algos.ppo import PPOConfig\n")
    assert imports(f) == ["ebrl.algos.ppo"]
