"""Text, pages and headings out of real files of each format, and one-line errors for bad ones."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import docx
import pytest
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from engine.rag import extract as extract_module
from engine.rag.extract import Document, ExtractError, extract, supported


def pdf_bytes(pages: list[str], *, password: str | None = None) -> bytes:
    """A real PDF, one page per string, each line a text-showing operator in Helvetica.

    pypdf writes the file (objects, cross-reference table, encryption); only the page's
    content stream is written by hand, since no installed library lays out text."""
    writer = PdfWriter()
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    for text in pages:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        shows = " ".join(f"({line}) Tj T*" for line in text.splitlines())
        stream = DecodedStreamObject()
        stream.set_data(f"BT /F1 12 Tf 14 TL 72 720 Td {shows} ET".encode())
        page.replace_contents(stream)
    if password is not None:
        writer.encrypt(password, algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def assert_slices(doc: Document) -> None:
    for s in doc.sections:
        assert s.text
        assert doc.text[s.start : s.start + len(s.text)] == s.text


def test_pdf_pages_become_sections_with_page_numbers(tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes(["Quarterly report\nRevenue grew", "Appendix tables"]))
    doc = extract(path)
    assert [s.page for s in doc.sections] == [1, 2]
    assert "Revenue grew" in doc.sections[0].text
    assert doc.sections[1].text == "Appendix tables"
    assert_slices(doc)


def test_pdf_encrypted_with_a_password_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret.pdf"
    path.write_bytes(pdf_bytes(["classified"], password="hunter2"))
    with pytest.raises(ExtractError, match=r"^encrypted PDF"):
        extract(path)


def test_pdf_encrypted_with_an_empty_password_is_read(tmp_path: Path) -> None:
    # Locked only against editing: readers open it without asking.
    path = tmp_path / "locked.pdf"
    path.write_bytes(pdf_bytes(["open to read"], password=""))
    assert extract(path).text == "open to read"


@pytest.mark.parametrize(
    "data",
    [b"%PDF-1.7\n" + b"garbage " * 100, b"not a pdf at all", b""],
    ids=["truncated", "not-pdf", "empty"],
)
def test_pdf_corrupt_is_an_extract_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "broken.pdf"
    path.write_bytes(data)
    with pytest.raises(ExtractError) as info:
        extract(path)
    assert "\n" not in str(info.value) and "PDF" in str(info.value)


def test_pdf_cut_in_half_is_an_extract_error(tmp_path: Path) -> None:
    whole = pdf_bytes(["first page", "second page"])
    path = tmp_path / "cut.pdf"
    path.write_bytes(whole[: len(whole) // 2])
    try:
        doc = extract(path)
    except ExtractError as e:
        assert "\n" not in str(e)
    else:  # pypdf may recover the pages before the cut; then what it gives is real text
        assert "first page" in doc.text


def test_pdf_without_text_says_so(tmp_path: Path) -> None:
    path = tmp_path / "scan.pdf"
    path.write_bytes(pdf_bytes([""]))
    with pytest.raises(ExtractError, match="no text"):
        extract(path)


def test_docx_headings_paragraphs_and_tables(tmp_path: Path) -> None:
    d = docx.Document()
    d.add_paragraph("Preface text.")
    d.add_heading("Installation", level=1)
    d.add_paragraph("Run the installer.")
    table = d.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "OS", "Size"
    table.cell(1, 0).text, table.cell(1, 1).text = "Linux", "40 MB"
    d.add_heading("Usage", level=2)
    d.add_paragraph("Open the app.")
    path = tmp_path / "manual.docx"
    d.save(str(path))
    doc = extract(path)
    assert [s.heading for s in doc.sections] == [None, "Installation", "Usage"]
    assert doc.sections[0].text == "Preface text."
    assert "Run the installer." in doc.sections[1].text
    assert "Linux | 40 MB" in doc.sections[1].text
    assert doc.sections[2].text.endswith("Open the app.")
    assert all(s.page is None for s in doc.sections)
    assert_slices(doc)


def test_docx_that_is_not_a_zip_is_an_extract_error(tmp_path: Path) -> None:
    path = tmp_path / "fake.docx"
    path.write_text("just text")
    with pytest.raises(ExtractError, match="corrupt DOCX"):
        extract(path)


def test_html_text_by_headings_without_scripts_or_styles(tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    path.write_text(
        "<html><head><title>The Guide</title><style>p { color: red }</style></head><body>"
        "<p>Intro with <b>bold</b> and wo<i>rd</i>s.</p><script>track()</script>"
        "<h2>Setup</h2><ul><li>first</li><li>second</li></ul>"
        "<h3>Details &amp; more</h3><pre>code  line\n  indented</pre></body></html>"
    )
    doc = extract(path)
    assert [s.heading for s in doc.sections] == ["The Guide", "Setup", "Details & more"]
    assert doc.sections[0].text == "Intro with bold and words."
    assert doc.sections[1].text == "Setup\n\nfirst\n\nsecond"
    assert "code  line\n  indented" in doc.sections[2].text  # preformatted text kept as is
    assert "track" not in doc.text and "color" not in doc.text
    assert_slices(doc)


def test_markdown_sections_are_slices_of_the_file_by_heading(tmp_path: Path) -> None:
    source = (
        "Opening words.\n\n# Title\n\nBody of title.\n\n```\n# not a heading\n```\n\n"
        "Second\n------\n\nSetext body.\n"
    )
    path = tmp_path / "notes.md"
    path.write_text(source)
    doc = extract(path)
    assert doc.text == source  # the file's own text: spans point into it
    assert [s.heading for s in doc.sections] == [None, "Title", "Second"]
    assert "# not a heading" in doc.sections[1].text
    assert doc.sections[2].text == "Second\n------\n\nSetext body."
    assert_slices(doc)


def test_rst_titles_become_headings(tmp_path: Path) -> None:
    path = tmp_path / "guide.rst"
    path.write_text("=====\nGuide\n=====\n\nIntro.\n\nTopic\n-----\n\nText.\n\n----\n\nAfter.\n")
    doc = extract(path)
    assert [s.heading for s in doc.sections] == ["Guide", "Topic"]
    assert doc.sections[1].text.endswith("After.")  # a transition is not a title
    assert_slices(doc)


def test_source_code_is_one_section_of_text(tmp_path: Path) -> None:
    code = 'def greet(name: str) -> str:\n    """Say hello."""\n    return f"hi {name}"\n'
    path = tmp_path / "greet.py"
    path.write_text(code)
    doc = extract(path)
    assert doc.text == code
    assert [(s.start, s.heading, s.page) for s in doc.sections] == [(0, None, None)]


def test_text_not_in_utf8_is_decoded_by_a_guessed_charset(tmp_path: Path) -> None:
    path = tmp_path / "old.txt"
    text = "Le café de la gare était fermé à l'aube, comme toujours en hiver.\r\n" * 5
    path.write_bytes(text.encode("cp1252"))
    doc = extract(path)
    assert "café de la gare était fermé" in doc.text
    assert "\r" not in doc.text


@pytest.mark.parametrize(
    "data",
    [b"PK\x03\x04\x00\x00binary\x00data", bytes(range(1, 32)) * 40],
    ids=["nul-bytes", "control-bytes"],
)
def test_binary_data_with_a_text_extension(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "data.txt"
    path.write_bytes(data)
    with pytest.raises(ExtractError, match=r"^binary file with a text extension$"):
        extract(path)


def test_random_bytes_with_a_text_extension(tmp_path: Path) -> None:
    path = tmp_path / "noise.json"
    path.write_bytes(os.urandom(4096).replace(b"\x00", b"\x01"))
    with pytest.raises(ExtractError, match=r"^binary file with a text extension$"):
        extract(path)


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, who may read anything: the refusal is simulated at open().
    path = tmp_path / "private.txt"
    path.write_text("secret")

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(extract_module, "open", denied, raising=False)
    with pytest.raises(ExtractError, match=r"^permission denied$"):
        extract(path)


def test_file_changed_while_being_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log.txt"
    path.write_text("first line\n")
    real_open = open

    def open_then_append(file: Any, *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, *args, **kwargs)
        with real_open(path, "a") as writer:  # another program appends meanwhile
            writer.write("a line written during the read\n")
        return handle

    monkeypatch.setattr(extract_module, "open", open_then_append, raising=False)
    with pytest.raises(ExtractError, match=r"^changed while being read$"):
        extract(path)


def test_fifo_is_not_opened(tmp_path: Path) -> None:
    # Opening a FIFO for reading would block until a writer came.
    path = tmp_path / "pipe.txt"
    os.mkfifo(path)
    with pytest.raises(ExtractError, match=r"^not a regular file$"):
        extract(path)


def test_missing_and_unsupported_files(tmp_path: Path) -> None:
    with pytest.raises(ExtractError, match=r"^file disappeared$"):
        extract(tmp_path / "gone.txt")
    picture = tmp_path / "photo.jpg"
    picture.write_bytes(b"\xff\xd8\xff")
    with pytest.raises(ExtractError, match=r"^not a supported format$"):
        extract(picture)


def test_supported_by_extension() -> None:
    for name in ["a.txt", "b.MD", "c.markdown", "d.rst", "e.htm", "f.pdf", "g.docx", "h.py",
                 "i.rs", "j.toml", "k.yaml", "l.json", "Makefile"]:  # fmt: skip
        assert supported(Path(name)), name
    for name in ["a.jpg", "b.exe", "c.zip", "d.doc", "noext"]:
        assert not supported(Path(name)), name
