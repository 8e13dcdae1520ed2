#!/usr/bin/env bash
# Issue 15's one-version models run, pinned to one commit while main moves on.
#
#   bash scripts/pinned_run.sh prepare     (here: builds devsnap/, git-ignored)
#   then, through the device tool, with carry ["devsnap"]:
#   T=570 B=440 bash devsnap/devrun.sh     (there: resumes the run that matches the card)
#   or LIMIT=545 bash devsnap/smart.sh     (there: the pinned run on an H200; on another card
#                                           HEAD's CUDA tests first (not with TESTS=0), then
#                                           the pinned run)
#
# devsnap/ is `git archive` of PINNED, with bench/ (the harness, which the records'
# coil_source leaves out) from HEAD and the committed results of both runs copied
# in, so `--resume` measures only the cases still missing.  devrun.sh picks the
# results file by the card's name: h200-$RUN on an H200, h100-$RUN on an H100;
# it never resumes one card's run on another card.  RUN names the pin's files:
# models-full was the run pinned at 0feee52 (sessions 32-45), models-pin46 the one
# pinned in session 46, after the conv nets' backward kernels (session 43), the
# joint graph's no-op copies and the memory plan's held inputs (45), int8 max-pool
# offsets and at least 8 calls a timing (46), models-pin55 the one pinned in session 55,
# after Wav2Vec2's positional convolution by taps (54) and realize's broadcast rule (53),
# models-pin58 the one pinned in session 58 (5ac2b75: its CUDA tests passed on an H100),
# after 1-d convolutions as 2-d channels-last ones on CUDA (Wav2Vec2's small inference
# 1.00 of Inductor's time at the last pin, 0.82 at this one, h100-models-s58-conv1d),
# with h200-models-pin55 still at 0 of 68 and h100-models-pin55 at 46.
# After each call, before the next: `bash scripts/pinned_run.sh collect FILES_AT`
# copies what came back (FILES_AT/r/*) to bench/results/ and devsnap/bench/results/
# (a call made before that, on the same warm machine, resumes from the last call's copy
# in that machine's /var/tmp/coil-pinned; on a fresh machine it would measure again what the
# last call did: session 52 lost two calls so); it refuses a file with fewer measured cases than the one it would
# replace.  Then commit.  T: the run's time limit (s), B: the bench's budget
# (s) for starting cases, C: cases warmed per chunk.  The call's timeout_s must
# exceed T by about 40 s (the install and the copies); with less, the call is
# killed and only the cases finished so far come back.
set -euo pipefail
cd "$(dirname "$0")/.."
PINNED=${PINNED:-5ac2b75}  # coil_source 50e2e364b115
RUN=${RUN:-models-pin58}
case "${1:-}" in
prepare)
    rm -rf devsnap && mkdir devsnap
    git archive "$PINNED" | tar -x -C devsnap
    # the harness from HEAD (coil_source hashes coil's packages only, never bench/)
    rm -rf devsnap/bench && git archive HEAD bench | tar -x -C devsnap
    cp bench/results/h200-$RUN.* bench/results/h100-$RUN.* devsnap/bench/results/ 2>/dev/null || true
    { echo "RUN=$RUN"; cat <<'EOF'; } > devsnap/devrun.sh
cd devsnap
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
dev=$(python3 -c "import torch; print(torch.cuda.get_device_name(0))")
echo "device: $dev"
case "$dev" in *H200*) N=h200-$RUN;; *H100*) N=h100-$RUN;; *) echo "neither card: stop"; exit 3;; esac
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
mkdir -p $OUT/r
# a warm machine keeps /var/tmp between calls: resume from the last call's file there when it
# holds more measured cases than the carried one (a call made before `collect` ran here)
keep=/var/tmp/coil-pinned; mkdir -p $keep
count() { python3 bench/measured.py "$1"; }
if [ "$(count $keep/$N.json)" -gt "$(count bench/results/$N.json)" ]; then
    echo "resuming from this machine's last call ($(count $keep/$N.json) measured, carried $(count bench/results/$N.json))"
    cp $keep/$N.* bench/results/
fi
cp bench/results/$N.* $OUT/r/ 2>/dev/null; echo "resuming $N"
python3 -c "from coil.graph_cache import coil_source_hash; print('source', coil_source_hash()[:12])"
timeout ${T:-520} python3 -m bench --suite models --device cuda --size both --compile-mode default \
    --compile-mode reduce-overhead --resume --name $N --out $OUT/r --budget-s ${B:-430} --warm-jobs 14 \
    --warm-chunk ${C:-7} 2>&1 | grep -v Warning | tail -12
cp $OUT/r/$N.* $keep/ 2>/dev/null || true
EOF
    # one call for whichever card comes: an H200 resumes the pinned run for T seconds; any other card
    # runs HEAD's CUDA tests first, then the pinned run (on that card's file) in what is left of
    # LIMIT seconds (the conv accuracy and first-timing probes ran on the H100 in session 49)
    cat > devsnap/smart.sh <<'SMART'
dev=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $dev"
case "$dev" in
*H200*) T=${T:-545} B=${B:-450} bash devsnap/devrun.sh;;
*) export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
   python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
   if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: the CUDA tests already ran at this HEAD
     timeout 230 python3 -m pytest -m cuda -q -n 12 -p no:cacheprovider -W ignore tests > $OUT/cuda.txt 2>&1; echo "pytest rc $?"
     tail -15 $OUT/cuda.txt
   fi
   left=$((${LIMIT:-555} - SECONDS)); echo "left for the pinned run: $left s"
   [ $left -gt 120 ] && T=$left B=$((left - 80)) bash devsnap/devrun.sh;;
esac
SMART
    du -sh devsnap
    ;;
collect)
    src=${2:?usage: bash scripts/pinned_run.sh collect FILES_AT}
    for json in "$src"/r/h200-$RUN.json "$src"/r/h100-$RUN.json; do
        [ -f "$json" ] || continue
        name=$(basename "$json" .json)
        new=$(python3 bench/measured.py "$json"); old=$(python3 bench/measured.py "bench/results/$name.json")
        echo "$name.json: $new records measured (the committed file: $old)"
        if [ "$new" -lt "$old" ]; then
            echo "refused: $json has fewer measured records than bench/results/$name.json" >&2
            exit 1
        fi
        for dest in bench/results devsnap/bench/results; do
            [ -d "$dest" ] || continue
            chmod u+w "$dest/$name".* 2>/dev/null || true
            cp "$src/r/$name.json" "$src/r/$name.md" "$dest/"
        done
    done
    ;;
*)
    echo "usage: bash scripts/pinned_run.sh prepare | collect FILES_AT" >&2
    exit 2
    ;;
esac
