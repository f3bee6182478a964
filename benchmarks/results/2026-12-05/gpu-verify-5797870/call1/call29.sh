# call 29: the owed GPU checks after the 86th session's scheduler change: fp8 checks beside the engine and features suites
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
T0=$(date +%s)
{ echo "commit $MINISGL_COMMIT"; date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; } > $OUT/env 2>&1
( OUT=$OUT timeout 300 bash tools/device_fp8.sh checks > $OUT/fp8.out 2>&1; echo "fp8 rc $? at $(( $(date +%s) - T0 ))" >> $OUT/env ) &
OUT=$OUT SUITE_TIMEOUT=${ST:-470} bash tools/device_suites.sh engine features > $OUT/suites.out 2>&1; echo "suites rc $? at $(( $(date +%s) - T0 ))" >> $OUT/env
wait
date -u >> $OUT/env
tail -5 $OUT/suites.out; cat $OUT/fp8.out; cat $OUT/env
