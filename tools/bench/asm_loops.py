#!/usr/bin/env python3
"""Cuts the loops that hold dot-product instructions out of an aarch64 assembly file, for
llvm-mca (tools/bench/neon_mca.sh).

Usage: asm_loops.py ASM SYMBOL_REGEX OUTPREFIX

For the first function whose label matches SYMBOL_REGEX, every region from a label to a
backward branch to it that holds `sdot`, `smull` or `smlal` instructions is written, without
labels and directives, as OUTPREFIX-<n>.s; one line per loop is printed: its number, its
instructions, its dot-product instructions, its calls, and its scale loads by kind (`ldr_d`, `ldr d`:
4 consecutive f16, `zip1`: 2 per chunk, `ld1r`: 1 per chunk), which tell the group size.
"""
import re
import sys

path, sym, prefix = sys.argv[1:4]
s = open(path).read().split('\n')
st = next(i for i, l in enumerate(s) if re.match(sym, l) and l.endswith(':'))
end = next(i for i in range(st, len(s)) if s[i].strip() == '.cfi_endproc')
body = s[st:end]
labels = {l[:-1]: i for i, l in enumerate(body) if re.match(r'^\.?L\w+:$', l)}
loops = []
for i, l in enumerate(body):
    m = re.match(r'^\s+b(\.\w+)?\s+(\.?L\w+)$', l) or re.match(r'^\s+(cbn?z|tbn?z)\s+.*,\s*(\.?L\w+)$', l)
    if m and m.group(2) in labels and labels[m.group(2)] < i:
        region = body[labels[m.group(2)] + 1:i + 1]
        ins = [x for x in region if x.strip() and not x.strip().startswith(('.', '//'))
               and not re.match(r'^\.?L\w+:$', x)]
        n = sum(bool(re.search(r'\b(sdot|smull2?|smlal2?)\b', x)) for x in ins)
        if n:
            loops.append(ins)
for k, ins in enumerate(loops):
    open(f'{prefix}-{k}.s', 'w').write('\n'.join(ins) + '\n')
    calls = sum('bl\t' in x for x in ins)
    print(k, len(ins), 'dots', sum(bool(re.search(r'\b(sdot|smull2?|smlal2?)\b', x)) for x in ins),
          'calls', calls, 'ldr_d', sum(bool(re.match(r'^\s+ldr\s+d\d+', x)) for x in ins),
          'ld1r', sum('ld1r' in x for x in ins), 'zip1', sum('zip1' in x for x in ins))
