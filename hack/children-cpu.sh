# Sourced by hack/timed.sh and hack/build-upstream.sh: the CPU seconds (user + system) a command's whole process tree
# used, as the kernel sums them for the shell that waited for it: /proc/<shell>/stat's cutime and cstime count every
# child the shell has waited for and, through them, every descendant they waited for in turn (the compilers of a
# `go build`). A process left running in the background, never waited for, is not counted.
#
#   children_cpu_ticks VAR          VAR = this shell's waited-for children's CPU so far, in clock ticks
#   cpu_seconds_since TICKS VAR     VAR = their CPU since children_cpu_ticks gave TICKS, in seconds ("12.3")
#
# Both set a variable rather than print: a command substitution would run them in a subshell, whose children are not
# this shell's.

clock_ticks_per_second=$(getconf CLK_TCK)

children_cpu_ticks() {
  local stat fields
  read -r stat <"/proc/$BASHPID/stat"
  read -ra fields <<<"${stat##*) }"  # fields[0] is the state (the stat's third field): cutime is the 16th, cstime the 17th
  printf -v "$1" '%d' $((fields[13] + fields[14]))
}

cpu_seconds_since() {
  local now tenths
  children_cpu_ticks now
  tenths=$(((now - $1) * 10 / clock_ticks_per_second))
  printf -v "$2" '%d.%d' $((tenths / 10)) $((tenths % 10))
}
