#!/usr/bin/env python3
"""Writes Sluice's man pages from the texts they document, so they cannot drift:

  sluice(8)       from `sluice --help`, and `sluice simulate --help` as its
                  SIMULATE section
  sluicectl(8)    from `sluicectl --help`
  sluice.toml(5)  from docs/CONFIG.md

Usage: scripts/man.py OUTDIR [SLUICE [SLUICECTL]]
(defaults: target/release/sluice and target/release/sluicectl of this checkout).
The help texts are sections of `Header:` lines and indented entries; each becomes a
.SH section, its entries kept as laid out (.nf), so every option --help lists is in
the page word for word (tests/packaging.rs checks it on the rendered page).
"""
import datetime
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def esc(line):
    """Escapes a line of text for roff: backslashes, and a leading . or '."""
    line = line.replace("\\", "\\e").replace("-", "\\-")
    if line.startswith((".", "'")):
        line = "\\&" + line
    return line


def version(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


def date():
    # SOURCE_DATE_EPOCH keeps package builds reproducible.
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or None
    when = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc) if epoch else \
        datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y-%m-%d")


def header(name, section, ver, what):
    return [
        f'.TH {name.upper()} {section} "{date()}" "sluice {ver}" "{what}"',
        ".SH NAME",
    ]


def help_text(binary, *args):
    return subprocess.run([binary, *args, "--help"], capture_output=True, text=True,
                          check=True).stdout


def verbatim_section(title, text):
    """TEXT as one section, laid out as printed."""
    lines = text.rstrip("\n").split("\n")
    return [f".SH {title}", ".nf"] + [esc(l) if l.strip() else "" for l in lines] + [".fi"]


def help_page(binary, name, summary, extra):
    """A man page from BINARY --help: `usage:` lines are the synopsis, each
    `Header:` paragraph a section, everything kept as laid out."""
    text = help_text(binary)
    ver = version(binary)
    out = header(name, 8, ver, "System Administration")
    out.append(f"{name} \\- {summary}")
    lines = text.rstrip("\n").split("\n")
    section = None
    body = []

    def flush():
        if section is None:
            return
        out.append(f".SH {section}")
        # Drop leading and trailing blank lines; keep the layout of the rest.
        while body and not body[0].strip():
            body.pop(0)
        while body and not body[-1].strip():
            body.pop()
        if body:
            out.append(".nf")
            out.extend(esc(b) if b.strip() else "" for b in body)
            out.append(".fi")

    for n, line in enumerate(lines):
        if section == "SYNOPSIS" and not line.strip():
            # The synopsis ends at the first blank line: options or a description follow.
            rest = [l for l in lines[n + 1:] if l.strip()]
            flush()
            section = "OPTIONS" if rest and rest[0].lstrip().startswith("-") else "DESCRIPTION"
            body = []
            continue
        m = re.match(r"^(usage|Usage):\s*(.*)$", line)
        if m:
            flush()
            section, body = "SYNOPSIS", [m.group(2)]
            indent = len(line) - len(m.group(2))
            continue
        m = re.match(r"^([A-Za-z][A-Za-z0-9 .,()/'-]*):\s*(.*)$", line)
        if m and not line.startswith(" ") and len(m.group(1)) < 60:
            flush()
            section = m.group(1).upper()
            body = [m.group(2)] if m.group(2) else []
            continue
        if section is None:
            section = "DESCRIPTION"
        if section == "SYNOPSIS":
            line = line[indent:] if line[:indent].strip() == "" else line.lstrip()
        body.append(line)
    flush()
    out.extend(extra)
    return "\n".join(out) + "\n"


def inline(text):
    """Markdown inline markup to roff: `code` and **bold** bold, *em* italic, links
    as their text."""
    text = esc(text)
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", text)
    text = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?!\w)", r"\\fI\1\\fR", text)
    return text


def markdown_page(path, ver):
    """sluice.toml(5) from docs/CONFIG.md: headings, paragraphs, lists, code blocks
    and tables (kept as laid out)."""
    out = header("sluice.toml", 5, ver, "File Formats")
    out.append("sluice.toml \\- configuration of the Sluice L4 load balancer")
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    para = []

    def end_para():
        if para:
            out.append(".PP")
            out.append(inline(" ".join(p.strip() for p in para)))
            para.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end_para()
            out.extend([".PP", ".RS 4", ".nf"])
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                out.append(esc(lines[i]) if lines[i].strip() else "")
                i += 1
            out.extend([".fi", ".RE"])
        elif line.startswith("#"):
            end_para()
            level = len(line) - len(line.lstrip("#"))
            title = inline(line.lstrip("#").strip())
            if level == 1:
                out.append(".SH DESCRIPTION")
            else:
                out.append((".SH " if level == 2 else ".SS ") + f'"{title}"')
        elif line.startswith("|"):
            end_para()
            out.extend([".PP", ".nf"])
            while i < len(lines) and lines[i].startswith("|"):
                if not re.match(r"^\|[\s:|-]+\|$", lines[i]):
                    cells = [c.strip() for c in lines[i].strip("|").split("|")]
                    out.append(inline(" | ".join(cells)))
                i += 1
            out.append(".fi")
            continue
        elif re.match(r"^\s*([-*]|\d+\.)\s+", line):
            end_para()
            item = [re.sub(r"^\s*([-*]|\d+\.)\s+", "", line)]
            while i + 1 < len(lines) and lines[i + 1].startswith("  ") \
                    and not re.match(r"^\s*([-*]|\d+\.)\s+", lines[i + 1]):
                i += 1
                item.append(lines[i].strip())
            out.extend([".IP \\(bu 2", inline(" ".join(item))])
        elif not line.strip() or re.match(r"^-{3,}\s*$", line):
            end_para()
        else:
            para.append(line)
        i += 1
    end_para()
    out.extend([
        ".SH FILES",
        ".TP",
        ".B /etc/sluice/sluice.toml",
        "The configuration the sluice service runs.",
        ".SH SEE ALSO",
        ".BR sluice (8),",
        ".BR sluicectl (8)",
    ])
    return "\n".join(out) + "\n"


SLUICE_EXTRA = [
    ".SH FILES",
    ".TP",
    ".B /etc/sluice/sluice.toml",
    "The configuration of the sluice service; see",
    ".BR sluice.toml (5).",
    ".TP",
    ".B /lib/systemd/system/sluice.service",
    "The systemd unit: prepares the host with \\-\\-prepare, runs the daemon",
    "(Type=notify), reloads with sluicectl reload.",
    ".SH SEE ALSO",
    ".BR sluicectl (8),",
    ".BR sluice.toml (5),",
    ".BR systemd.service (5),",
    ".BR sd_notify (3)",
]

SLUICECTL_EXTRA = [
    ".SH SEE ALSO",
    ".BR sluice (8),",
    ".BR sluice.toml (5),",
    ".BR ipvsadm (8)",
]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    sluice = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "target/release/sluice")
    ctl = sys.argv[3] if len(sys.argv) > 3 else os.path.join(HERE, "target/release/sluicectl")
    os.makedirs(outdir, exist_ok=True)
    pages = {
        "sluice.8": help_page(sluice, "sluice", "L4 load balancer on DPDK",
                              verbatim_section("SIMULATE", help_text(sluice, "simulate"))
                              + SLUICE_EXTRA),
        "sluicectl.8": help_page(ctl, "sluicectl",
                                 "control a running sluice daemon (ipvsadm syntax too)",
                                 SLUICECTL_EXTRA),
        "sluice.toml.5": markdown_page(os.path.join(HERE, "docs/CONFIG.md"), version(sluice)),
    }
    for name, text in pages.items():
        with open(os.path.join(outdir, name), "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
