import json

from conftest import run_cli
from cuforge.doctor import check_api_keys
from cuforge.procenv import is_secret_name, scrubbed_env


def test_scrubbed_env_removes_credentials_only():
    base = {"OPENAI_API_KEY": "sk-1", "ANTHROPIC_API_KEY": "a", "HF_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
            "GITHUB_TOKEN": "g", "MY_PASSWORD": "p", "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "HOME": "/h"}
    env = scrubbed_env({"EXTRA": "1"}, base=base)
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "HOME": "/h", "EXTRA": "1"}
    assert is_secret_name("openai_api_key") and not is_secret_name("PYTHONPATH")


def test_api_key_check_names_never_values():
    c = check_api_keys({"OPENAI_API_KEY": "sk-very-secret-value"})
    assert "OPENAI_API_KEY" in c.detail and "sk-very" not in c.detail


def test_doctor_json_reports_every_check():
    r = run_cli("doctor", "--json", env={"OPENAI_API_KEY": "sk-do-not-print"})
    assert r.returncode == 0, r.stderr
    assert "sk-do-not-print" not in r.stdout
    report = json.loads(r.stdout)
    names = {c["name"] for c in report["checks"]}
    assert names == {"python", "torch", "cuda", "nvcc", "nvrtc", "ncu", "llm_keys", "judge", "jail"}
    for c in report["checks"]:
        assert c["ok"] or c["fix"], c  # every missing piece comes with its fix
    judge = next(c for c in report["checks"] if c["name"] == "judge")
    assert "file candidates: split" in judge["detail"] and "own kernels: inprocess" in judge["detail"], judge


def test_doctor_names_a_wrong_judge_setting():
    r = run_cli("doctor", "--json", env={"CUFORGE_JUDGE": "sideways"})
    judge = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "judge")
    assert not judge["ok"] and "CUFORGE_JUDGE='sideways'" in judge["detail"] and "inprocess or split" in judge["fix"]


def test_doctor_reports_the_jail_from_a_real_jailed_worker():
    """The jail check starts a worker and lets it try what a hostile candidate would; with no jail
    it says so, and names what run/eval will then demand."""
    r = run_cli("doctor", "--json", env={"OPENAI_API_KEY": "sk-do-not-print"})
    jail = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "jail")
    assert jail["ok"], jail
    for held in ("secrets", "network", "processes", "read-only", "hidden", "limits"):
        assert held in jail["detail"], (held, jail["detail"])
    r = run_cli("doctor", "--json", env={"CUFORGE_JAIL": "none"})
    jail = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "jail")
    assert not jail["ok"] and "--unsafe-no-jail" in jail["fix"]
