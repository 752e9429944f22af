#!/usr/bin/env python3
"""Single-thread tokenizer throughput: lathe (bin/bench_tokenizer) against the
Hugging Face `tokenizers` library on the same English and Korean text, with
the ids of both compared in the same run.

Text: the English messages and their Korean translations from the gettext
catalogs in /usr/share/locale/ko/LC_MESSAGES (postgres, git, coreutils, bash,
...), plus the English licence texts in /usr/share/common-licenses; or give
--english / --korean files.

Usage: python3 bench/tokenizer_bench.py build/bin/bench_tokenizer [--names llama3] [--repeat 3]
"""
import argparse
import gettext
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
import tokenizers  # noqa: E402


def catalog_texts():
    en, ko = [], []
    for path in sorted(glob.glob("/usr/share/locale/ko/LC_MESSAGES/*.mo")):
        try:
            with open(path, "rb") as f:
                cat = gettext.GNUTranslations(f)._catalog
        except Exception:
            continue
        for k, v in cat.items():
            k = k[0] if isinstance(k, tuple) else k
            if k and v:
                en.append(k)
                ko.append(v)
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                en.append(f.read())
    return "\n".join(en), "\n".join(ko)


def hf_time(tok, text, repeat):
    """Best wall and thread-CPU times of the reference over two ways of calling
    it (one big string, or a loop over lines): the baseline is its faster one."""
    lines = text.split("\n")
    best, best_cpu, ids = 1e30, 1e30, None

    def timed(fn):
        nonlocal best, best_cpu
        t0, c0 = time.perf_counter(), time.thread_time()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.thread_time() - c0)
        return out

    for _ in range(repeat):
        ids = timed(lambda: tok.encode(text, add_special_tokens=False).ids)
        timed(lambda: [tok.encode(line, add_special_tokens=False) for line in lines])
    return best, best_cpu, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_bin")
    ap.add_argument("--names", default="llama3")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--english")
    ap.add_argument("--korean")
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "tokenizers"))
    args = ap.parse_args()

    en, ko = catalog_texts()
    if args.english:
        en = open(args.english, encoding="utf-8").read()
    if args.korean:
        ko = open(args.korean, encoding="utf-8").read()
    tmp = tempfile.mkdtemp()
    ok = True
    print(f"{'tokenizer':10} {'text':8} {'MB':>6} {'lathe MB/s':>11} {'HF MB/s':>9} {'ratio':>7} "
          f"{'lathe cpu':>10} {'HF cpu':>8} {'cpu ratio':>9} ids")
    for name in args.names.split(","):
        tdir = os.path.join(args.shared, name)
        ref = tokenizers.Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
        for label, text in (("English", en), ("Korean", ko)):
            path = os.path.join(tmp, label + ".txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            ids_path = os.path.join(tmp, "ids.json")
            out = subprocess.run([args.bench_bin, "--tokenizer", tdir, "--file", path, "--repeat", str(args.repeat),
                                  "--ids-out", ids_path], check=True, capture_output=True, text=True).stdout
            lathe = json.loads(out)
            hf_s, hf_cpu_s, hf_ids = hf_time(ref, text, args.repeat)
            same = json.load(open(ids_path)) == hf_ids
            ok &= same
            mb = len(text.encode("utf-8")) / 1e6
            hf_mbs, hf_cpu_mbs = mb / hf_s, mb / hf_cpu_s
            print(f"{name:10} {label:8} {mb:6.2f} {lathe['mb_per_s']:11.2f} {hf_mbs:9.2f} "
                  f"{lathe['mb_per_s'] / hf_mbs:6.1f}x {lathe['cpu_mb_per_s']:10.2f} {hf_cpu_mbs:8.2f} "
                  f"{lathe['cpu_mb_per_s'] / hf_cpu_mbs:8.1f}x {'same' if same else 'DIFFERENT'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
