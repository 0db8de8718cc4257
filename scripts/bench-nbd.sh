#!/usr/bin/env bash
# NBD benchmark: fio's nbd engine against (a) `zeta serve` on a one-file pool (or, with
# --layout raidz2, a raidz2 of six files) and (c) `nbdkit file` serving a raw file of the same
# size on the same disk, in one run, with ratios; and the disk itself as the ceiling of what
# is persisted.
#
#   scripts/bench-nbd.sh [--runtime SECONDS] [--size SIZE] [--dir DIR] [--bs "4k 128k"] [--runs N]
#                        [--layout stripe|raidz2] [--leaf-size SIZE] [--rw "randwrite write"]
#                        [--tls]
#
# Each point is fio --rw={read,write,randread,randwrite} (or those --rw names) at queue depth
# 32 for --runtime seconds (default 20, as the issue asks; use less for a quick look). With --runs N each point
# is measured N times, alternating servers, and the median is printed. Needs fio, nbdkit and a
# release build of zeta (built here if missing). Prints IOPS, mean and p99 latency, and the
# zeta/nbdkit IOPS ratio; then the peak RSS of the zeta server.
#
# disk_iops is fio with O_DIRECT (libaio) on a third file of the volume's size, same pattern
# and depth: what the disk does when every byte reaches it, with no copy through the page
# cache. nbdkit's writes stay in the page cache: with a 1G file on a machine of a few GiB or
# more, the kernel writes nothing back within a run (it waits 30 s, or for a tenth of memory
# to be dirty). zeta writes every block to its file and syncs every txg, so at large sizes
# its writes meet the disk's ceiling long before nbdkit's.
#
# --tls measures the cost of TLS on the same zeta server, in the same run: it serves with
# --tls=on and a pre-shared key, and nbdcopy (libnbd, GnuTLS) copies a file of SIZE random
# bytes into the volume and the volume out to null:, in the clear (nbd://) and through TLS
# (nbds://...?tls-psk-file=), --runs times each in turn; it prints the median MB/s of each and
# the tls/plain ratio; and the same of `nbdkit file` with --tls=require (GnuTLS in the server
# too) for reference. (fio's nbd engine cannot do TLS here: libnbd refuses it the key file
# of a URI, and as root reads X.509 credentials only from /etc/pki/libnbd.)
#
# The pool is three times the volume (--leaf-size sets each file's size instead). A
# copy-on-write pool places a txg's new copies while the frees of the two txgs before it are
# still held (crash safety), so random overwrites need free room of about five txgs to run at
# full speed: on a pool two-thirds full, 128K random writes ran at half the IOPS of one a
# third full (9.5k against 18.5k on the development machine).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=20 SIZE=1G DIR=${TMPDIR:-/tmp} BSS="4k 8k 16k 32k 64k 128k" RWS="randread randwrite read write" RUNS=1 LAYOUT=stripe LEAF_SIZE= TLS=
while [ $# -gt 0 ]; do
    case "$1" in
        --runtime) RUNTIME=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        --bs) BSS=$2; shift 2 ;;
        --rw) RWS=$2; shift 2 ;;
        --runs) RUNS=$2; shift 2 ;;
        --layout) LAYOUT=$2; shift 2 ;;
        --leaf-size) LEAF_SIZE=$2; shift 2 ;;
        --tls) TLS=1; shift ;;
        -h|--help) sed -n "2,/^set /p" "$0" | sed "\$d"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for rw in $RWS; do
    case "$rw" in read|write|randread|randwrite) ;; *) echo "unknown --rw $rw (see --help)" >&2; exit 2 ;; esac
done
for t in fio nbdkit python3; do
    command -v $t >/dev/null || { echo "$t is required (apt-get install fio nbdkit)" >&2; exit 1; }
done
cargo build --release -q
ZETA=${CARGO_TARGET_DIR:-$PWD/target}/release/zeta

WORK=$(mktemp -d "$DIR/zeta-bench-nbd.XXXXXX")
ZPID="" KPID=""
cleanup() {
    [ -n "$ZPID" ] && kill -TERM "$ZPID" 2>/dev/null && wait "$ZPID" 2>/dev/null || true
    [ -n "$KPID" ] && kill "$KPID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

export ZETA_HOME=$WORK/home
bytes() { python3 -c "import sys;u={'K':1<<10,'M':1<<20,'G':1<<30};s=sys.argv[1];print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))" "$1"; }
BYTES=$(bytes "$SIZE")
# The pool's files are written in full before the pool is made on them, as the raw file is by
# the fill below: a file system allocates a block on the first write to it (on ext4 at a sixth
# of the speed of a rewrite), and a copy-on-write pool keeps writing where its file was never
# written until it has been through all of it. Both servers are measured in that steady state.
precondition() { # bytes files...
    local bytes=$1; shift
    for f in "$@"; do
        dd if=/dev/zero of="$f" bs=1M count=$((bytes >> 20)) conv=fdatasync status=none
    done
}
case "$LAYOUT" in
    stripe)
        LEAF_BYTES=${LEAF_SIZE:+$(bytes "$LEAF_SIZE")}
        LEAF_BYTES=${LEAF_BYTES:-$((3 * BYTES + (256 << 20)))}
        precondition $LEAF_BYTES "$WORK/leaf"
        $ZETA pool create bench "$WORK/leaf" >/dev/null ;;
    raidz2)
        # Four data columns of six: the volume and its parity take a quarter of its size on
        # each file; three times that makes the pool's space three times the volume.
        LEAF_BYTES=${LEAF_SIZE:+$(bytes "$LEAF_SIZE")}
        LEAF_BYTES=${LEAF_BYTES:-$((3 * BYTES / 4 + (256 << 20)))}
        precondition $LEAF_BYTES "$WORK"/leaf{0,1,2,3,4,5}
        $ZETA pool create bench raidz2 "$WORK"/leaf{0,1,2,3,4,5} >/dev/null ;;
    *) echo "unknown layout $LAYOUT (stripe or raidz2)" >&2; exit 2 ;;
esac
$ZETA vol create bench/v "$SIZE" >/dev/null
truncate -s "$BYTES" "$WORK/raw"
precondition "$BYTES" "$WORK/disk"

TLS_ARGS=() TLS_URI=""
if [ -n "$TLS" ]; then
    python3 -c 'import secrets; print("bench:" + secrets.token_hex(32))' >"$WORK/keys.psk"
    TLS_ARGS=(--tls=on --tls-psk "$WORK/keys.psk")
    TLS_URI="nbds://bench@127.0.0.1:10811/bench/v?tls-psk-file=$WORK/keys.psk"
fi
$ZETA serve --listen 127.0.0.1:10811 "${TLS_ARGS[@]}" bench >"$WORK/zeta.log" 2>&1 &
ZPID=$!
nbdkit --exit-with-parent -f -p 10812 -i 127.0.0.1 file "$WORK/raw" >"$WORK/nbdkit.log" 2>&1 &
KPID=$!
if [ -n "$TLS" ]; then
    nbdkit --exit-with-parent -f -p 10813 -i 127.0.0.1 --tls=require --tls-psk="$WORK/keys.psk" \
        file "$WORK/raw" >"$WORK/nbdkit-tls.log" 2>&1 &
fi
sleep 1

# Fill both once so reads hit written data, not holes.
for uri in nbd://127.0.0.1:10811/bench/v nbd://127.0.0.1:10812/; do
    fio --name=fill --ioengine=nbd --uri=$uri --rw=write --bs=1M --iodepth=8 --size="$BYTES" \
        --output-format=terse >/dev/null
done

FIO_SUMMARY='
import json,sys
t=sys.stdin.read()
j=json.loads(t[t.index("{"):])["jobs"][0]
side=j["read"] if j["read"]["io_bytes"] else j["write"]
lat=side["clat_ns"]
print("%.0f %.1f %.1f" % (side["iops"], lat["mean"]/1e3, lat["percentile"].get("99.000000",0)/1e3))'
point() { # uri rw bs -> "iops mean_us p99_us"
    fio --name=p --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth=32 --size="$BYTES" \
        --time_based --runtime="$RUNTIME" --ramp_time=1 --output-format=json |
    python3 -c "$FIO_SUMMARY"
}
disk_point() { # rw bs -> "iops mean_us p99_us", O_DIRECT on the disk file
    fio --name=d --filename="$WORK/disk" --direct=1 --ioengine=libaio --rw="$1" --bs="$2" \
        --iodepth=32 --size="$BYTES" --time_based --runtime="$RUNTIME" --ramp_time=1 \
        --output-format=json | python3 -c "$FIO_SUMMARY"
}
median() { python3 -c 'import sys; v=sorted(sys.stdin.read().split("\n")[:-1], key=lambda l: float(l.split()[0])); print(v[len(v)//2])'; }

printf "%-10s %5s %10s %9s %9s %10s %9s %9s %7s %10s %9s\n" rw bs zeta_iops mean_us p99_us \
    nbdkit_iops mean_us p99_us ratio disk_iops zeta/disk
for rw in $RWS; do
    for bs in $BSS; do
        Z="" K="" D=""
        for _ in $(seq "$RUNS"); do
            Z+="$(point nbd://127.0.0.1:10811/bench/v $rw $bs)"$'\n'
            K+="$(point nbd://127.0.0.1:10812/ $rw $bs)"$'\n'
            D+="$(disk_point $rw $bs)"$'\n'
        done
        z=$(printf "%s" "$Z" | median) k=$(printf "%s" "$K" | median) d=$(printf "%s" "$D" | median)
        read -r zi zm zp <<<"$z"; read -r ki km kp <<<"$k"; read -r di _ _ <<<"$d"
        printf "%-10s %5s %10s %9s %9s %10s %9s %9s %7.2f %10s %9.2f\n" $rw $bs $zi $zm $zp $ki $km \
            $kp "$(python3 -c "print($zi/$ki if $ki else 0)")" $di "$(python3 -c "print($zi/$di if $di else 0)")"
    done
done

if [ -n "$TLS" ]; then
    # The cost of TLS: nbdcopy in and out, in the clear and through TLS, in turn.
    head -c "$BYTES" /dev/urandom >"$WORK/rand"
    copy_mbs() { # src dst -> MB/s
        local t0 t1
        t0=$(date +%s.%N)
        nbdcopy -S 0 "$1" "$2"
        t1=$(date +%s.%N)
        python3 -c "print('%.0f' % ($BYTES / 1e6 / ($t1 - $t0)))"
    }
    printf "\n%-22s %10s %10s %9s %10s %10s %9s\n" "nbdcopy (SIZE $SIZE)" zeta_MB/s tls_MB/s \
        tls/plain nbdkit_MB/s tls_MB/s tls/plain
    ratio() { python3 -c "print($1/$2 if $2 else 0)"; }
    for dir in write read; do
        for server in zeta nbdkit; do
            if [ $server = zeta ]; then
                plain=nbd://127.0.0.1:10811/bench/v tls=$TLS_URI
            else
                plain=nbd://127.0.0.1:10812/ tls="nbds://bench@127.0.0.1:10813/?tls-psk-file=$WORK/keys.psk"
            fi
            P="" T=""
            for _ in $(seq "$RUNS"); do
                if [ $dir = write ]; then
                    P+="$(copy_mbs "$WORK/rand" "$plain")"$'\n'
                    T+="$(copy_mbs "$WORK/rand" "$tls")"$'\n'
                else
                    P+="$(copy_mbs "$plain" null:)"$'\n'
                    T+="$(copy_mbs "$tls" null:)"$'\n'
                fi
            done
            p=$(printf "%s" "$P" | median) t=$(printf "%s" "$T" | median)
            if [ $server = zeta ]; then zp=$p zt=$t; else kp=$p kt=$t; fi
        done
        printf "%-22s %10s %10s %9.2f %10s %10s %9.2f\n" "$dir" "$zp" "$zt" "$(ratio $zt $zp)" \
            "$kp" "$kt" "$(ratio $kt $kp)"
    done
    rm -f "$WORK/rand"
fi

# Memory under many connections: 32 jobs x QD 32 of random writes.
fio --name=mem --ioengine=nbd --uri=nbd://127.0.0.1:10811/bench/v --rw=randwrite --bs=128k \
    --iodepth=32 --numjobs=32 --size="$BYTES" --time_based --runtime=$(( RUNTIME < 10 ? RUNTIME : 10 )) \
    --output-format=terse >/dev/null
# The limits the server reports in its first line ("... per pool: cache 256M, dirty limit 1G)").
LIMITS=$(sed -n 's/.*per pool: cache \([^,]*\), dirty limit \([^)]*\)).*/\1 + dirty \2/p' "$WORK/zeta.log")
echo "zeta server peak RSS: $(grep VmHWM /proc/$ZPID/status | awk '{print $2/1024 " MiB"}') (limit: cache $LIMITS + 64M)"
