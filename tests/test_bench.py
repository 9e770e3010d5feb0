"""The bench scripts run end to end (tiny sizes) and their tables hold what they claim.

Speed itself is never asserted here: targets are measured by the scripts, side by side
in one run, and recorded in bench/RESULTS.md.
"""

from conftest import run_script

TINY_MODEL = ["--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=32", "--vocab_size=512"]


def rows_by_first_cell(stdout):
    """{first cell: [other cells]} of every markdown table row in stdout (headers included)."""
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in stdout.splitlines() if line.startswith("| ")]
    return {r[0]: r[1:] for r in rows}


def test_train_speed_table_has_every_variant_against_linear():
    out = run_script("bench/train_speed.py", *TINY_MODEL, "--block_size=16", "--batch_size=2", "--rounds=2",
                     "--warmup=1", "--unfused").stdout
    rows = rows_by_first_cell(out)
    assert list(rows) == ["variant", "linear", "identity", "res_gelu", "residual", "mlp475", "linear unfused",
                          "res_gelu unfused"]
    params = {name: int(cells[0].replace(",", "")) for name, cells in rows.items() if name != "variant"}
    assert params["linear"] - params["identity"] == 32 * 32  # the one layer's W_Q
    assert params["res_gelu unfused"] == params["res_gelu"] and params["linear unfused"] == params["linear"]
    assert rows["linear"][-1] == "1.000"
    assert "command: python bench/train_speed.py --device=cpu" in out


def test_sample_speed_cached_generation_gives_the_same_tokens():
    out = run_script("bench/sample_speed.py", *TINY_MODEL, "--new_tokens=24", "--prompt_len=4").stdout
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines() if line.startswith("| ")][1:]
    assert [(r[0], r[1]) for r in rows] == [
        (mode, batch) for mode in ("linear", "identity", "res_gelu", "residual") for batch in ("1", "8")]
    assert all(r[-1] == "yes" for r in rows)


def test_data_speed_tokenizes_the_same_tokens_with_any_number_of_workers():
    out = run_script("bench/data_speed.py", "--device=cpu", "--copies=1", "--fetch_gib=0.01", "--fetches=5",
                     "--workers=1,2").stdout
    rows = rows_by_first_cell(out)
    assert rows["1"][:2] == rows["2"][:2] == ["1,258", "1,568,239"]  # documents, tokens
    index_row = out.split("| seconds | peak RSS MiB")[1].splitlines()[2]
    seconds, peak_mib, file_mib = (float(c.replace(",", "")) for c in index_row.strip("|").split("|"))
    # measured in the fresh process that built the 220 MiB file: torch alone is >100 MiB resident
    assert seconds > 0 and peak_mib > 100 and file_mib == 220
