"""scripts/_bench.write_rows: the benchmarks' CSV, columns from the first row."""
import csv

from scripts._bench import write_rows


def test_rows_round_trip_and_empty(tmp_path):
    path = tmp_path / "r.csv"
    write_rows(str(path), [{"a": 1, "b": "x"}, {"a": 2.5, "b": ""}])
    with open(path, newline="") as f:
        assert list(csv.DictReader(f)) == [{"a": "1", "b": "x"}, {"a": "2.5", "b": ""}]
    write_rows(str(path), [])
    assert path.read_text() == ""
