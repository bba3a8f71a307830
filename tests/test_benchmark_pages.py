"""BENCHMARKS.md is a summary a reader can navigate: one page per benchmark under docs/benchmarks/, each naming
the raw output it comes from, and every figure the README's benchmark paragraphs cite is on the page they link to.
Every figure of the README's results and of BENCHMARKS.md's tables leads to a raw file with a row in
benchmarks/results/INDEX.md."""

import pathlib
import re

from test_readme import broken_links

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SUMMARY = ROOT / "BENCHMARKS.md"
PAGES = ROOT / "docs" / "benchmarks"
RESULTS = ROOT / "benchmarks" / "results"
HISTORY = PAGES / "history.md"

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#]*)(?:#([^)\s]*))?\)")
# A figure: a decimal number (39.3, 0.70, 1,028.5), or a whole number with a unit or a ratio sign (593 ms, 1.12×).
FIGURE = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+(?=\s?(?:×|%|ms\b|s\b|GB\b|GiB\b|MiB\b|µs\b)))"
                    r"(?![\d]|[.,]\d)")
# A number right after a product's name is its version (CTranslate2 4.8.5, fairseq 0.12), not a figure.
VERSION_BEFORE = re.compile(r"(?:fairseq|CTranslate2|JAX|jax|Python|libtpu|Flax|PyTorch|torch|transformers|version)\s*$")


def benchmark_pages() -> list[pathlib.Path]:
    return sorted(PAGES.glob("*.md"))


def strip_code(text: str) -> str:
    """The text without fenced blocks, inline code and HTML comments (their numbers are settings, not figures)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def figures(text: str) -> list[str]:
    """The figures a piece of prose cites, versions left out."""
    return [match.group(1) for match in FIGURE.finditer(text)
            if not VERSION_BEFORE.search(text[:match.start()])]


def states(page_text: str, figure: str) -> bool:
    """Whether a page states the figure as a whole number (12.9 is not in 112.9 or 12.95)."""
    return re.search(rf"(?<![\d.,]){re.escape(figure)}(?!\d|[.,]\d)", page_text) is not None


def is_benchmark_page(path: pathlib.Path) -> bool:
    return path.resolve() == SUMMARY or path.resolve().parent == PAGES


def cited_figures(text: str, base: pathlib.Path) -> list[tuple[str, pathlib.Path]]:
    """(figure, page) for every figure of every paragraph that links to BENCHMARKS.md or docs/benchmarks/: the
    figures before a link belong to it (back to the previous link); those after the last link to the last
    benchmark link. Figures before a link to another page are that page's business, not checked here."""
    cited = []
    for paragraph in re.split(r"\n\s*\n", strip_code(text)):
        links = list(LINK.finditer(paragraph))
        targets = [(base / link.group(2)) if link.group(2) else None for link in links]
        if not any(target is not None and is_benchmark_page(target) for target in targets):
            continue
        start, last_benchmark = 0, None
        for link, target in zip(links, targets):
            segment = paragraph[start:link.start()] + link.group(1)
            start = link.end()
            if target is None or not is_benchmark_page(target):
                continue
            last_benchmark = target
            cited += [(figure, target) for figure in figures(segment)]
        cited += [(figure, last_benchmark) for figure in figures(paragraph[start:])]
    return cited


def missing_figures(text: str, base: pathlib.Path) -> list[str]:
    return [f"{figure} (not on {page.relative_to(ROOT)})" for figure, page in cited_figures(text, base)
            if not page.exists() or not states(page.read_text(encoding="utf-8"), figure)]


def test_every_figure_the_readme_cites_is_on_the_page_it_links_to():
    readme = README.read_text(encoding="utf-8")
    cited = cited_figures(readme, ROOT)
    pages = {page.name for _, page in cited}
    # The accelerator, CPU speed and time-to-BLEU paragraphs: dozens of figures over several pages.
    assert len(cited) >= 40 and {"accelerators.md", "train_step.md", "decoding.md", "time_to_bleu.md"} <= pages
    assert not missing_figures(readme, ROOT), missing_figures(readme, ROOT)


def test_the_figure_check_catches_a_figure_the_page_lacks():
    prose = ("On one H200 ours takes 0.70× the example's time (39.3 against 56.0 ms, 6.74 GB) and 987.65 ms on "
             "another day ([accelerators](docs/benchmarks/accelerators.md)); CTranslate2 4.8.5 is a version. "
             "Greedy reached 4321.5 sentences/s ([decoding](docs/benchmarks/decoding.md)).")
    assert {figure for figure, _ in cited_figures(prose, ROOT)} == {"0.70", "39.3", "56.0", "6.74", "987.65",
                                                                    "4321.5"}
    assert missing_figures(prose, ROOT) == ["987.65 (not on docs/benchmarks/accelerators.md)",
                                            "4321.5 (not on docs/benchmarks/decoding.md)"]
    # A figure is a whole number on the page: 6.7 is not stated by a page that says 6.74.
    assert states("peak 6.74 GB", "6.74") and not states("peak 6.74 GB", "6.7") and not states("16.74", "6.74")


def raw_files_named(text: str) -> set[str]:
    return set(re.findall(r"benchmarks/results/([\w\-]+(?:\.[\w\-]+)*\.\w+)", text))


def test_every_benchmark_page_names_raw_output_that_exists():
    pages = benchmark_pages()
    assert len(pages) >= 8 and HISTORY in pages
    for page in [SUMMARY, *pages]:
        named = raw_files_named(page.read_text(encoding="utf-8"))
        missing = sorted(name for name in named if not (RESULTS / name).exists())
        assert not missing, f"{page.name} names raw files that do not exist: {missing}"
        if page.parent == PAGES and page != HISTORY:
            assert named, f"{page.name} names no raw file under benchmarks/results/"


def test_every_raw_file_is_named_by_a_page():
    """A raw file no page names backs no figure a reader can find (`x.json` beside a named `x.txt` counts)."""
    named = set().union(*(raw_files_named(page.read_text(encoding="utf-8")) for page in benchmark_pages()))
    stems = {name.rsplit(".", 1)[0] for name in named}
    raw = [path.name for path in RESULTS.iterdir() if path.is_file() and path.name != "INDEX.md"]
    assert len(raw) >= 50
    orphans = sorted(name for name in raw if name.rsplit(".", 1)[0] not in stems)
    assert not orphans, f"no docs/benchmarks page names {orphans}"


def test_the_summary_is_short_and_every_link_leads_to_a_page_and_heading():
    text = SUMMARY.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    linked = {(SUMMARY.parent / target).resolve() for _, target, _ in LINK.findall(text) if target}
    assert {page.resolve() for page in benchmark_pages()} <= linked, "BENCHMARKS.md leaves out a section page"
    broken = [link for path in [SUMMARY, *benchmark_pages()] for link in broken_links(path)]
    assert not broken, f"links to files or headings that do not exist: {broken}"


def test_every_section_page_links_back_to_the_summary_before_its_first_section():
    for page in benchmark_pages():
        head = page.read_text(encoding="utf-8").split("\n## ", 1)[0]
        assert "](../../BENCHMARKS.md)" in head, f"{page.name} does not link back to BENCHMARKS.md"


DIARY = [r"\bsessions?\b", r"\b(?:round|session) \d+(?![\d.])", r"\bissues?\b", r"\bby my count\b",
         r"\b(?:I|my|me)\b", r"\b(?:this|last|next) round\b"]


def diary_wording(text: str) -> list[str]:
    """The diary phrases of a page's prose (code left out): sessions, rounds, issue numbers, the first person."""
    prose = strip_code(text)
    return [match.group(0) for pattern in DIARY for match in re.finditer(pattern, prose,
                                                                         0 if "I|my" in pattern else re.I)]


def test_the_pages_read_as_results_not_a_diary():
    for page in [SUMMARY, *benchmark_pages()]:
        found = diary_wording(page.read_text(encoding="utf-8"))
        assert not found, f"{page.name} reads as a diary: {found}"


INDEX = RESULTS / "INDEX.md"


def index_table(text: str) -> list[str]:
    """The rows of INDEX.md's table (one or more raw files each), checked to be one table: a row cut off from
    the header by a paragraph would render as plain text."""
    lines = text.splitlines()
    table = [number for number, line in enumerate(lines) if line.startswith("|")]
    assert table and table == list(range(table[0], table[0] + len(table))), "INDEX.md's table is broken up"
    return [lines[number] for number in table[2:]]


def files_of_row(row: str) -> list[str]:
    """The raw files a row names in its first cell: `x.txt`, `.json` is x.txt and x.json."""
    named = []
    for name in re.findall(r"`([^`]+)`", row.split("|")[1]):
        named.append(named[-1].rsplit(".", 1)[0] + name if name.startswith(".") and named else name)
    return named


def test_files_of_row_reads_a_json_beside_its_text():
    assert files_of_row("| `a-1.txt`, `.json`, `b.jsonl` | aot | x | y |") == ["a-1.txt", "a-1.json", "b.jsonl"]


def test_the_results_index_links_to_pages_and_headings_that_exist():
    text = INDEX.read_text(encoding="utf-8")
    links = [target for _, target, _ in LINK.findall(text) if "://" not in target]
    # Every row links to where its figure is written up, on the section pages or the history.
    assert len(links) >= len(index_table(text))
    assert {(INDEX.parent / target).resolve().parent for target in links} >= {PAGES}
    assert not broken_links(INDEX), f"INDEX.md links to files or headings that do not exist: {broken_links(INDEX)}"


def test_the_results_index_reads_as_results_not_a_diary():
    found = diary_wording(INDEX.read_text(encoding="utf-8"))
    assert not found, f"INDEX.md reads as a diary: {found}"


def test_every_raw_file_has_a_row_in_the_results_index():
    rows = index_table(INDEX.read_text(encoding="utf-8"))
    indexed = [name for row in rows for name in files_of_row(row)]
    raw = sorted(path.name for path in RESULTS.iterdir() if path.is_file() and path.name != "INDEX.md")
    assert len(raw) >= 50
    assert not sorted(set(raw) - set(indexed)), f"no row of INDEX.md names {sorted(set(raw) - set(indexed))}"
    assert not sorted(set(indexed) - set(raw)), f"INDEX.md names files not there: {sorted(set(indexed) - set(raw))}"
    assert len(indexed) == len(set(indexed)), "INDEX.md names a file in two rows"


# A raw file behind every headline figure. A figure of README.md's "Results" or of BENCHMARKS.md's result sections
# belongs to the first link after it in its table row or paragraph (to the last link when none follows), and that
# link must lead to its raw output: a file under benchmarks/results/ that INDEX.md has a row for, or a section page
# heading (or a whole page) that a row of INDEX.md links to as where its file is written up.
NOT_RESULTS = {"Contents", "Machines", "Rerunning"}  # BENCHMARKS.md's sections without figures of ours
GROUPED_COUNT = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\d]|[.,]\d)")


def sections(text: str) -> dict[str, str]:
    """A page's `## ` sections by heading, fenced blocks and HTML comments left out."""
    text = re.sub(r"<!--.*?-->", "", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.S)
    return {part.split("\n", 1)[0].strip(): part.split("\n", 1)[-1] for part in re.split(r"^## ", text, flags=re.M)[1:]}


def blocks(text: str) -> list[str]:
    """The table rows and the paragraphs of a section, each one block."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        rows = [line for line in paragraph.splitlines() if line.startswith("|")]
        found += rows if rows else [paragraph]
    return found


def raw_places() -> tuple[set[str], set[tuple[pathlib.Path, str | None]]]:
    """The raw files INDEX.md has rows for, and the (page, heading anchor; None: the whole page) its rows link to."""
    rows = index_table(INDEX.read_text(encoding="utf-8"))
    files = {name for row in rows for name in files_of_row(row)}
    places = {((INDEX.parent / target).resolve(), anchor or None) for row in rows
              for _, target, anchor in LINK.findall(row) if target and "://" not in target}
    return files, places


def leads_to_raw_output(target: pathlib.Path, anchor: str | None, files: set[str],
                        places: set[tuple[pathlib.Path, str | None]]) -> bool:
    """Whether a link leads to raw output: an indexed raw file, or a page (heading) an INDEX.md row links to."""
    target = target.resolve()
    if target.parent == RESULTS.resolve():
        return target.exists() and target.name in files
    return (target, anchor) in places or (target, None) in places


def counted_by_a_test(block: str) -> bool:
    """A block of counts, not measurements (the model sizes): it names a test file that states each of its
    grouped whole numbers (63,073,280 as 63_073_280 or 63073280); its percentages follow from them."""
    counts = GROUPED_COUNT.findall(strip_code(block))
    tests = [ROOT / name for name in re.findall(r"tests/[\w/]+\.py", block) if (ROOT / name).exists()]
    stated = "".join(path.read_text(encoding="utf-8") for path in tests).replace("_", "")
    return bool(counts and tests) and all(states(stated, count.replace(",", "")) for count in counts)


def figures_without_raw_output(text: str, base: pathlib.Path, headings: set[str] | None = None,
                               exclude: set[str] = frozenset()) -> tuple[list[str], int]:
    """The figures of a page's result sections (`headings`, or every section but `exclude`) without raw output, as
    "figure (where its link leads)", with every raw file named there that lacks an INDEX.md row; and how many
    figures were checked. A block (table row or paragraph) that names a raw file with a row backs all its figures.
    A table row whose last cell says "not measured" cites others' figures (the paper's); a block counted by a test
    needs no raw file."""
    unbacked, checked = [], 0
    files, places = raw_places()
    for heading, body in sections(text).items():
        if (headings is not None and heading not in headings) or heading in exclude:
            continue
        for block in blocks(body):
            if block.startswith("|") and block.rstrip(" |").rsplit("|", 1)[-1].strip().startswith("not measured"):
                continue
            if counted_by_a_test(block):
                continue
            named = raw_files_named(block)
            unbacked += [f"benchmarks/results/{name} (no INDEX.md row)" for name in sorted(named - files)]
            prose = strip_code(block)
            links = list(LINK.finditer(prose))
            for match in FIGURE.finditer(prose):
                if VERSION_BEFORE.search(prose[:match.start()]):
                    continue
                checked += 1
                if named & files:
                    continue
                link = next((link for link in links if link.start() > match.start()), links[-1] if links else None)
                if link is None:
                    unbacked.append(f"{match.group(1)} (no link) in {prose[:60]!r}")
                    continue
                target = (base / link.group(2)) if link.group(2) else base
                if not leads_to_raw_output(target, link.group(3), files, places):
                    unbacked.append(f"{match.group(1)} ({link.group(2)}#{link.group(3) or ''})")
    return unbacked, checked


def test_every_headline_figure_leads_to_a_raw_file_with_an_index_row():
    readme_unbacked, readme_checked = figures_without_raw_output(README.read_text(encoding="utf-8"), ROOT,
                                                                 headings={"Results"})
    summary_unbacked, summary_checked = figures_without_raw_output(SUMMARY.read_text(encoding="utf-8"), ROOT,
                                                                   exclude=NOT_RESULTS)
    # The README's results (the demo, accelerators, CPU speed, time to BLEU) and every table of the summary.
    assert readme_checked >= 40 and summary_checked >= 150, (readme_checked, summary_checked)
    assert not readme_unbacked, f"README.md's results cite figures without raw output: {readme_unbacked}"
    assert not summary_unbacked, f"BENCHMARKS.md cites figures without raw output: {summary_unbacked}"


def test_the_raw_output_check_catches_a_figure_without_a_raw_file():
    measured = "docs/benchmarks/accelerators.md#measured-on-one-nvidia-h100-2026-11-26"  # a row of INDEX.md links it
    unindexed = "docs/benchmarks/data_pipeline.md#a-section-no-row-links"
    suite_raw = "benchmarks/results/test-suite-2026-12-07.txt"
    page = ("# Page\n\n## Results\n\n"
            "| run | BLEU | status |\n|---|---|---|\n"
            "| ours | 79.85 ([demo](docs/benchmarks/no_such_page.md)) | measured |\n"
            f"| ours | 78.56 ([history](docs/benchmarks/no_such_page.md); raw `{suite_raw}`) | measured |\n"
            "| paper | 27.3 | not measured yet; the paper reports 27.3 |\n\n"
            f"On one H100 ours took 0.58× the example's time ([accelerators]({measured})); start-up took "
            f"95.3 s ([data]({unindexed})).\n\n"
            "Raw: 12.5 s ([file](benchmarks/results/no-such-file.txt)).\n\n"
            "1,192 s ([suite](docs/benchmarks/test_suite.md)); 7.5 s after the last link.\n\n"
            "A run of 3.25 s, no link.\n\n"
            "63,073,280 and 214,226,944 parameters (+0.58%; `tests/model/test_transformer.py`).\n\n"
            "63,073,281 parameters (`tests/model/test_transformer.py`).\n\n"
            "## Other\n\n1.5 s, not a result section.\n")
    unbacked, checked = figures_without_raw_output(page, ROOT, headings={"Results"})
    assert unbacked == ["79.85 (docs/benchmarks/no_such_page.md#)",
                        f"95.3 ({unindexed})",
                        "benchmarks/results/no-such-file.txt (no INDEX.md row)",
                        "12.5 (benchmarks/results/no-such-file.txt#)",
                        "3.25 (no link) in 'A run of 3.25 s, no link.'",
                        "63,073,281 (no link) in '63,073,281 parameters ().'"], unbacked
    # Checked: 79.85, 78.56 (its row names a raw file with a row), 0.58, 95.3, 12.5, 1,192 and 7.5 (a page that a row
    # links as a whole), 3.25, 63,073,281; not the paper's row, the counted block or another section.
    assert checked == 9
    assert counted_by_a_test("63,073,280 parameters (`tests/model/test_transformer.py`)")
    assert not counted_by_a_test("63,073,280 parameters (`tests/no_such_test.py`)")
    assert not counted_by_a_test("0.58× (`tests/model/test_transformer.py`)")
