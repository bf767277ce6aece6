#!/bin/sh
# Long functions and long files in our C and CUDA sources (issue 31, item 5):
#   tests/tools/lengths.sh [-f MAXFUNC] [-l MAXFILE] [FILE...]
# Prints one line per offender and exits 1 if there is any, 0 otherwise:
#   function FILE:LINE NAME N lines (limit MAXFUNC)
#   file FILE N lines (limit MAXFILE)
# Limits: 80 lines per function, 1000 per file (-f and -l change them; the
# test tests/layout.lua lowers them to see that this can fail).
#
# What counts: every *.c, *.h, *.cu and *.cuh under interp/, bindings/,
# cuda/ and tests/ (the library, the program, the backends, and the C
# tests: embed/, unit/, fuzz/, tools/), as git lists them (find where there
# is no git: a build carried to a GPU machine), so nothing generated counts
# (build*/: the embedded stdlib, the host kernels' runtime string).  Not
# counted: the fuzzers' corpus (tests/fuzz/corpus/: inputs, not code), Lua
# files, bench/ (raw CUDA C references), docs.  FILE... checks those files
# instead (tests/layout.lua's self-test).
#
# A function is a block at file level whose header ends with ')' before its
# '{' (so no table or struct initializer, no extern "C" block): the
# brace on the signature line (`static int f(void) {`) or alone at column 0
# on the next (`{`), as both are written in the tree; a signature may run
# over several lines.  Its length is the lines from the one holding its
# opening brace to its closing '}' at column 0, both counted.  Lines of a
# preprocessor directive (with their '\' continuations) are not headers, so
# functions written inside a macro are not seen.
#
# An exception: a function that must stay long (generated or table-like
# code, a switch a table cannot replace) says why in one comment holding
#   long: <why>
# (e.g. `/* long: one case per op kind, a table would hide the order */`),
# in the comment just above the function or on the first line of its body.
# A marker without a reason does not count.  There is no exception for files.
maxf=80
maxl=1000
while [ $# -gt 0 ]; do
  case $1 in
  -f) maxf=$2; shift 2 ;;
  -l) maxl=$2; shift 2 ;;
  -*) echo "lengths.sh: unknown option $1" >&2; exit 2 ;;
  *) break ;;
  esac
done
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
if [ $# -eq 0 ]; then
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    set -- $(git ls-files -- 'interp/*.[ch]' 'bindings/*.[ch]' 'cuda/*.[ch]' 'cuda/*.cu' 'cuda/*.cuh' \
      'tests/*.[ch]' 'tests/*.cu' | grep -v '^tests/fuzz/corpus/' | sort)
  else
    set -- $(find interp bindings cuda tests \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' \) \
      ! -path 'tests/fuzz/corpus/*' | sort)
  fi
fi
[ $# -gt 0 ] || { echo "lengths.sh: no sources found" >&2; exit 2; }
for f in "$@"; do [ -r "$f" ] || { echo "lengths.sh: cannot read $f" >&2; exit 2; }; done
awk -v maxf="$maxf" -v maxl="$maxl" '
function reset_header() { hdr = ""; hdrmark = 0; above = 0 }
function comment_mark(s) { return s ~ /long:[ \t]*[^ \t*\/]/ }
function endfile() {
  if (last > maxl) { printf "file %s %d lines (limit %d)\n", fname, last, maxl; bad++ }
}
FNR == 1 {
  if (NR > 1) endfile()
  infn = 0; incomment = 0; inpp = 0; reset_header()
}
{ fname = FILENAME; last = FNR; line = $0 }
# a preprocessor directive and its continuation lines
inpp || (!infn && line ~ /^[ \t]*#/) {
  inpp = (line ~ /\\$/)
  if (!infn) reset_header()
  next
}
infn {
  if (FNR == start + 1 && comment_mark(line)) mark = 1
  if (line ~ /^}/) {
    n = FNR - start + 1
    if (n > maxf && !mark) {
      printf "function %s:%d %s %d lines (limit %d)\n", FILENAME, start, name, n, maxf
      bad++
    }
    infn = 0; reset_header()
  }
  next
}
# comments at file level: a marker in the comment just above a function counts
incomment {
  if (comment_mark(line)) above = 1
  if (line ~ /\*\//) incomment = 0
  next
}
hdr == "" && (line ~ /^[ \t]*\/\*/ || line ~ /^[ \t]*\/\//) {
  if (comment_mark(line)) above = 1
  if (line ~ /^[ \t]*\/\*/ && line !~ /\*\//) incomment = 1
  next
}
line ~ /^[ \t]*$/ { reset_header(); next }
hdr == "" && line !~ /^[A-Za-z_]/ { reset_header(); next }
{
  hdr = hdr " " line
  if (comment_mark(line)) hdrmark = 1
  code = line; gsub(/\/\*.*\*\//, "", code); sub(/\/\/.*/, "", code); sub(/[ \t]+$/, "", code)
  if (code ~ /[;}]$/) { reset_header(); next }
  if (code !~ /\{$/) next
  h = hdr; gsub(/\/\*[^*]*\*\//, "", h); sub(/\{[^{]*$/, "", h); sub(/[ \t]+$/, "", h)
  if (h ~ /\)[ \t]*(const|noexcept|override)?$/ && h !~ /^[ \t]*typedef[ \t]/) {
    infn = 1; start = FNR; mark = above || hdrmark
    gsub(/__(launch_bounds|attribute)__[ \t]*\(\(?[^)]*\)?\)/, "", h)
    name = h; sub(/[ \t]*\(.*/, "", name); sub(/.*[ \t*&]/, "", name)
  }
  reset_header()
}
END {
  if (NR > 0) endfile()
  exit bad ? 1 : 0
}' "$@"
