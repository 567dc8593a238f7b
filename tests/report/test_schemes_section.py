"""report.schemes_section: the scaling-schemes study's section, left out of a report whose records lack the study
(experiments/' test_schemes builds it from a tiny study)."""

from attnscale import report
from attnscale.report.schemes_section import TITLE


def test_a_report_without_the_study_leaves_the_section_out(tmp_path):
    from test_report import write_runs

    paths = report.build(write_runs(tmp_path / "runs", training=False))
    assert TITLE not in paths["markdown"].read_text()
    assert not any(name.startswith("schemes-") for name in paths)
