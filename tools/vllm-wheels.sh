#!/usr/bin/env bash
# vLLM 0.26.0 (the newest release built against torch 2.11.0 / CUDA 13.0) and the 29 small wheels it needs beside
# the lent GPU machine's image, for CPython 3.12 on x86-64 Linux, cut into groups that each fit one device call
# (64 MiB per call, the working tree included). See docs/vllm-on-a-lease.md for why these and no others.
#
# Run here, from the project's root (it needs PyPI):  bash tools/vllm-wheels.sh
#   VLLM_SLIM=1   drop FlashAttention-2 (_vllm_fa2_C, 123.5 MiB packed: H100 uses FA3) and the Rust API-server
#                 binary vllm-rs from the vLLM wheel: 3 calls instead of 6 (not yet run on a GPU)
#   CAP_MIB=58    the most MiB that one group (one call's carry) may hold; larger files are split into parts
# It writes .device/vllm/ (ignored by git through .git/info/exclude):
#   g01/ g02/ ...   one folder per call: carry exactly that folder, e.g. carry=[".device/vllm/g01"]
#   manifest.txt    which group goes in which call, with sizes
#   install.sh      sourced on the device machine from the project's root once every group has arrived:
#                   reassembles the split files, checks their sha256, installs all wheels into /tmp/site
#                   (pip --no-index --no-deps --no-compile --target) and exports PYTHONPATH and vLLM's settings
# Never carry ".device" or ".device/vllm" whole while the groups are here: that is ~300 MiB, over the limit.
# Install in the last transfer call (its command: source .device/vllm/install.sh), then delete the groups here.
set -euo pipefail

[ -f pyproject.toml ] && [ -d trinity_like ] || { echo "run from the project's root" >&2; exit 2; }
OUT=.device/vllm
CAP_MIB=${CAP_MIB:-58}
SLIM=${VLLM_SLIM:-0}
VLLM=vllm==0.26.0
# What `from vllm import LLM` / AsyncLLM imports beyond the image (found by importing with each one left out),
# their dependencies, and four tiny ones used at run time (depyf+astor+dill, setproctitle, blake3);
# typing-extensions and idna because pydantic needs typing-extensions>=4.16 and httpx2 idna>=3.18, newer than the
# image may hold. Versions as pip resolved them on 2026-11-25 (xgrammar 0.2.7: 0.2.8 wants apache-tvm-ffi>=0.1.11,
# vLLM pins 0.1.10).
PINS=(
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  msgspec==0.22.0 pybase64==1.5.1 cbor2==6.3.0 cachetools==8.0.2 pyzmq==27.3.0
  openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1
  openai-harmony==0.0.8 fastapi==0.136.3 starlette==1.10.0
  llguidance==1.7.6 xgrammar==0.2.7 apache-tvm-ffi==0.1.10 partial-json-parser==0.2.1.1.post7
  depyf==0.20.0 astor==0.8.1 dill==0.4.1 setproctitle==1.3.8 blake3==1.0.11
  typing-extensions==4.16.0 idna==3.20
)
# vLLM requirements deliberately left out (the image lacks them; see the doc): install.sh's pip check ignores them
SKIPPED='anthropic|compressed-tensors|fastsafetensors|flashinfer-python|humming-kernels|ijson|jsonschema|lark|lm-format-enforcer|mcp|mistral-common|model-hosting-container-standards|nvidia-cudnn-frontend|nvidia-cutlass-dsl|nvtx|opentelemetry-[a-z-]+|outlines-core|prometheus-fastapi-instrumentator|pynvvideocodec|python-json-logger|quack-kernels|tilelang|tokenspeed-mla|torchcodec|watchfiles'

if [ -d .git ]; then
  mkdir -p .git/info
  grep -qx "/.device/" .git/info/exclude 2>/dev/null || echo "/.device/" >> .git/info/exclude
fi
rm -rf "$OUT"; mkdir -p "$OUT/dl"

plat=()
for n in 17 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
echo "downloading $VLLM and ${#PINS[@]} wheels into $OUT ..."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${plat[@]}" -d "$OUT/dl" "$VLLM" "${PINS[@]}" 2>&1 | grep -v '^WARNING' || true
n=$(ls "$OUT"/dl/*.whl | wc -l)
[ "$n" -eq $(( ${#PINS[@]} + 1 )) ] || { echo "expected $(( ${#PINS[@]} + 1 )) wheels, got $n" >&2; exit 1; }

if [ "$SLIM" = 1 ]; then
  w=$(ls "$OUT"/dl/vllm-0.26.0-*.whl)
  zip -q -d "$w" 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs'
  t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
  unzip -q "$w" 'vllm-0.26.0.dist-info/RECORD' -d "$t"
  grep -vE '^vllm/(vllm_flash_attn/_vllm_fa2_C\.abi3\.so|vllm-rs),' "$t/vllm-0.26.0.dist-info/RECORD" > "$t/R"
  mv "$t/R" "$t/vllm-0.26.0.dist-info/RECORD"
  (cd "$t" && zip -q "$OLDPWD/$w" vllm-0.26.0.dist-info/RECORD)
  echo "slim: removed FlashAttention-2 and vllm-rs from $(basename "$w")"
fi

# split, pack into groups (first fit, largest first), write manifest.txt and install.sh
python3 - "$OUT" "$CAP_MIB" "$SLIM" "$SKIPPED" <<'PY'
import hashlib, os, subprocess, sys, datetime
out, cap_mib, slim, skipped = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
cap = int(cap_mib * 2**20)
dl = os.path.join(out, 'dl')
MiB = lambda b: b / 2**20
wheels = sorted(f for f in os.listdir(dl) if f.endswith('.whl'))
sha = {w: hashlib.sha256(open(os.path.join(dl, w), 'rb').read()).hexdigest() for w in wheels}
total = sum(os.path.getsize(os.path.join(dl, w)) for w in wheels)
items, split = [], {}                      # items: (size, name); split: wheel -> [part names]
for w in wheels:
    p = os.path.join(dl, w)
    if os.path.getsize(p) > cap:
        subprocess.run(['split', '-b', str(cap), '-d', '-a', '2', p, p + '.part-'], check=True)
        os.remove(p)
        split[w] = sorted(f for f in os.listdir(dl) if f.startswith(w + '.part-'))
        items += [(os.path.getsize(os.path.join(dl, f)), f) for f in split[w]]
    else:
        items.append((os.path.getsize(p), w))
groups = []                                 # [used bytes, [names]]
for size, name in sorted(items, key=lambda x: (-x[0], x[1])):
    for g in groups:
        if g[0] + size <= cap:
            g[0] += size; g[1].append(name); break
    else:
        groups.append([size, [name]])
where = {}
for i, (used, names) in enumerate(groups, 1):
    gd = os.path.join(out, 'g%02d' % i); os.makedirs(gd)
    for f in names:
        os.rename(os.path.join(dl, f), os.path.join(gd, f)); where[f] = 'g%02d/%s' % (i, f)
os.rmdir(dl)
n = len(groups)
with open(os.path.join(out, 'manifest.txt'), 'w') as m:
    m.write('# vLLM 0.26.0 for the device machine (cp312, manylinux x86_64%s), made %s by tools/vllm-wheels.sh\n'
            % (', slim' if slim == '1' else '', datetime.date.today()))
    m.write('# %d wheels, %.1f MiB, in %d calls of at most %.0f MiB each (plus the working tree).\n'
            % (len(wheels), MiB(total), n, cap_mib))
    m.write('# Make the calls back to back (the machine goes back after 30 s idle); each command can be `true`,\n')
    m.write('# the last one (it also carries install.sh): source .device/vllm/install.sh && python3 -c "import vllm"\n')
    m.write('# Then, here: rm -rf .device/vllm/g?? before a call that carries .device whole (tools/gpu-check).\n')
    for i, (used, names) in enumerate(groups, 1):
        carry = ['.device/vllm/g%02d' % i] + (['.device/vllm/install.sh'] if i == n else [])
        m.write('call %d  %6.1f MiB  carry=%s\n' % (i, MiB(used), str(carry).replace("'", '"')))
        for f in sorted(names):
            m.write('          %8.2f MiB  %s\n' % (MiB(os.path.getsize(os.path.join(out, where[f]))), f))
whole = [w for w in wheels if w not in split]
lines = ['# Sourced on the device machine from the project\'s root, after every call of manifest.txt arrived.',
         '# Reassembles the split wheels, checks sha256, installs into $VLLM_SITE (default /tmp/site) once, and',
         '# exports PYTHONPATH and the settings vLLM needs without the packages left out. PYTHON: default python3.',
         '_vllm_install() {',
         '  local d=.device/vllm site=${VLLM_SITE:-/tmp/site} py=${PYTHON:-python3} f',
         '  local asm=${site%/}.wheels',
         '  if [ ! -f "$site/.vllm-0.26.0-done" ]; then',
         '    for f in %s; do' % ' '.join(sorted(where.values())),
         '      [ -f "$d/$f" ] || { echo "vllm: $d/$f is missing: resend its call (manifest.txt)" >&2; return 1; }',
         '    done',
         '    mkdir -p "$asm" "$site" || return 1']
for w, parts in split.items():
    lines.append('    cat %s > "$asm/%s" || return 1' % (' '.join('"$d/%s"' % where[p] for p in parts), w))
for w in split:
    lines.append('    echo "%s  $asm/%s" | sha256sum -c --quiet || return 1' % (sha[w], w))
lines += ['    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \\',
          '      ' + ' '.join('"$asm/%s"' % w for w in split) + ' \\',
          '      ' + ' '.join('"$d/%s"' % where[w] for w in whole) + ' || return 1',
          '    rm -rf "$asm"; touch "$site/.vllm-0.26.0-done"',
          '    echo "vllm: installed into $site"',
          '    PYTHONPATH=$site "$py" -m pip check 2>&1 | grep -vE "^vllm 0\\.26\\.0 requires (%s), which is not installed" \\' % skipped,
          '      | grep -v "^No broken requirements" | sed "s/^/vllm: pip check: /" | head -40',
          '  fi',
          '  case ":${PYTHONPATH:-}:" in *":$site:"*) ;; *) export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH} ;; esac',
          '}',
          '_vllm_install && export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1',
          '']
open(os.path.join(out, 'install.sh'), 'w').write('\n'.join(lines))
print('%d wheels, %.1f MiB, %d calls:' % (len(wheels), MiB(total), n))
print(open(os.path.join(out, 'manifest.txt')).read())
PY
