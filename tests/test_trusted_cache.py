"""The shared cache: written only by the supervisor from a new worker's hello, verified on read."""

import base64

from cuforge.sandbox.protocol import trusted_cache


def test_entries_are_accepted_only_as_plain_kind_and_name_and_read_back_only_when_intact(tmp_path):
    offered = {"ceilings/H100.json": base64.b64encode(b'{"a": 1}').decode(),
               "native/../../evil.pth": base64.b64encode(b"import os").decode(),
               "cubins/x.cubin": base64.b64encode(b"\x7fELF").decode(),
               "native/.hidden": base64.b64encode(b"x").decode(),
               "native/lib.so": "not base64!"}
    assert trusted_cache.accept(tmp_path, offered) == ["ceilings/H100.json"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["H100.json", "H100.json.sha256", "ceilings"]
    trusted_cache.configure(tmp_path)  # as the worker does with its --shared-cache
    try:
        assert trusted_cache.verified_bytes("ceilings", "H100.json") == b'{"a": 1}'
        (tmp_path / "ceilings" / "H100.json").write_bytes(b'{"a": 999}')  # tampered after it was written
        assert trusted_cache.verified_bytes("ceilings", "H100.json") is None
        assert trusted_cache.verified_path("cubins", "x.cubin") is None
    finally:
        trusted_cache.configure(None)
    assert trusted_cache.verified_bytes("ceilings", "H100.json") is None  # no shared cache: nothing is read


def test_a_worker_hands_over_what_it_made_before_any_candidate(tmp_path):
    f = tmp_path / "lib.so"
    f.write_bytes(b"\x7fELF...")
    out = trusted_cache.handover({"native/lib.so": f, "native/missing.so": tmp_path / "missing.so"})
    assert list(out) == ["native/lib.so"] and base64.b64decode(out["native/lib.so"]) == b"\x7fELF..."
