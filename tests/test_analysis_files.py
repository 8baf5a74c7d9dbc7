"""analysis.files: a result file is read from its plain path or, where only that exists, from
``<path>.gz`` (committed results are gzipped; new runs write plain files)."""

import gzip

import pytest

from analysis import files
from analysis.report import main as report

CSV = "run_id,step,value\na,1,0.5\na,2,0.75\n"


def _gzip(path):
    """Replace ``path`` by ``path.gz`` as results/ stores it (``gzip -9 -n``: no name, no time)."""
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes(), 9, mtime=0))
    path.unlink()


def test_the_plain_file_is_read_where_it_exists_and_its_gz_where_only_that_does(tmp_path):
    plain = tmp_path / "plain" / "curves.csv"
    plain.parent.mkdir()
    plain.write_text(CSV)
    packed = tmp_path / "packed" / "curves.csv"
    packed.parent.mkdir()
    packed.write_text(CSV)
    _gzip(packed)
    assert not packed.exists() and files.exists(packed)
    assert files.resolve(plain) == plain
    assert files.resolve(packed) == packed.with_name("curves.csv.gz")
    for p in (plain, packed):
        assert files.read_text(p) == CSV
        with files.open_text(p, newline="") as f:
            assert f.read() == CSV
        assert files.read_csv(p)["value"].tolist() == [0.5, 0.75]


def test_the_plain_file_wins_over_a_stale_gz(tmp_path):
    path = tmp_path / "runs.csv"
    path.with_name("runs.csv.gz").write_bytes(gzip.compress(b"old\n1\n"))
    path.write_text("new\n2\n")
    assert files.read_text(path) == "new\n2\n"


def test_a_missing_file_is_named_by_its_plain_path(tmp_path):
    path = tmp_path / "metrics.csv"
    assert not files.exists(path) and files.resolve(path) == path
    with pytest.raises(FileNotFoundError, match=r"metrics\.csv"):
        files.read_csv(path)


def test_the_report_reads_a_gzipped_export(tmp_path):
    """An export with runs.csv.gz and curves.csv.gz gives the same table as the plain one."""
    runs = "run_id,scheduler,scheduler_variant,simulator,policy,seed,throughput_e2e\n"
    runs += "".join(
        f"{s}{i},{s},{s},PushCube-v1,MLPPolicy,{i},{v + i}\n"
        for s, v in (("EBRLScheduler", 100.0), ("SyncScheduler", 80.0))
        for i in range(3)
    )
    tables = {}
    for form in ("plain", "gz"):
        export = tmp_path / form / "export"
        export.mkdir(parents=True)
        (export / "runs.csv").write_text(runs)
        (export / "curves.csv").write_text(CSV.replace("a,", "EBRLScheduler0,"))
        if form == "gz":
            _gzip(export / "runs.csv")
            _gzip(export / "curves.csv")
        out = tmp_path / form / "report"
        assert report(["--runs", str(export), "--kind", "headline", "--out", str(out)]) == 0
        tables[form] = (out / "headline.md").read_text().split("Provenance")[0]
    assert tables["gz"] == tables["plain"]
    assert "| EBRL |" in tables["gz"]
