# gpu-step.sh — `step NAME TIMEOUT CMD...` for the gpu-*.sh scripts (sourced from the
# repository root): runs CMD under `timeout`, its output in $LOG/NAME.log, adds a row (name,
# ok or FAIL:status, seconds) to the array ROWS for the summary the script prints last, sets
# rc=1 on failure and returns CMD's status. With LIMIT set (seconds since the script
# started), a step that would start less than 20 s before it is skipped (a row says so);
# with STEP_AFTER set, that command runs after every step (e.g. to save the logs so far).
# (gpu-e2e.sh keeps its own copy: it runs from a packed folder without the scripts.)
step() {
  local name=$1 to=$2
  shift 2
  if [ -n "${LIMIT:-}" ] && [ $((SECONDS + 20)) -gt "$LIMIT" ]; then
    ROWS+=("$(printf '%-34s skipped (time)' "$name")")
    return 1
  fi
  local t0=$SECONDS
  timeout "$to" "$@" >"$LOG/$name.log" 2>&1
  local r=$?
  ROWS+=("$(printf '%-34s %-8s %4ss' "$name" "$([ $r = 0 ] && echo ok || echo "FAIL:$r")" \
    "$((SECONDS - t0))")")
  [ $r = 0 ] || rc=1
  [ -z "${STEP_AFTER:-}" ] || $STEP_AFTER
  return $r
}
