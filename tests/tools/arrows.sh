#!/bin/sh
# The calls between the device layer's files, from a build's objects:
#   tests/tools/arrows.sh [BUILD]      (default build; build-cuda has cuda/cuda/)
# File A has an arrow to file B when an undefined symbol of A's object is
# defined by B's (one arrow per pair, whatever the symbols).  The neutral
# files are ranked, lowest first, as docs/internals.md orders them; an arrow
# runs back up when a neutral file calls a higher one, or calls into a
# backend (cuda/cuda/, cuda/host/) by name rather than through dev_backend.
# Prints each such arrow with its symbols, then the counts, and the files of
# the largest circle (those that reach each other through arrows).
# -v: every arrow.
verbose=0
[ "$1" = -v ] && { verbose=1; shift; }
obj=${1:-build}/obj
[ -d "$obj/cuda" ] || { echo "arrows.sh: no $obj/cuda (build first)" >&2; exit 1; }
for o in $(find "$obj/cuda" -name '*.o' | sort); do
  f=${o#"$obj"/}; f=${f%.o}
  nm -g --defined-only "$o" | awk -v f="$f" 'NF == 3 && $2 ~ /[TDBRVW]/ { print "D", f, $3 }'
  nm -u "$o" | awk -v f="$f" '{ print "U", f, $NF }'
done | awk -v verbose=$verbose '
BEGIN {
  # the neutral files, lowest first (docs/internals.md, "Layout")
  rank["cuda/util"] = 0; rank["cuda/dtype"] = 0; rank["cuda/kernel_sig"] = 0; rank["cuda/dev_err"] = 0
  rank["cuda/names"] = 1; rank["cuda/kcache"] = 1
  rank["cuda/cpu_reduce"] = 2; rank["cuda/cpu_matmul"] = 2
  rank["cuda/cpu_ops"] = 3; rank["cuda/shm_comm"] = 3
  rank["cuda/trace"] = 4; rank["cuda/race"] = 4; rank["cuda/module"] = 4
  rank["cuda/dev_sync"] = 5
  rank["cuda/dev_buf"] = 6; rank["cuda/dev_stream"] = 6; rank["cuda/dev_stage"] = 6
  rank["cuda/dev_op"] = 7; rank["cuda/dev_coll"] = 7; rank["cuda/dev_graph"] = 7
  rank["cuda/dev"] = 8
}
$1 == "D" { def[$3] = $2; next }
{ und[++nu] = $2 " " $3 }
function backend(f) { return f ~ /^cuda\/(cuda|host)\// }
END {
  for (i = 1; i <= nu; i++) {
    split(und[i], p, " "); a = p[1]; s = p[2]
    if (!(s in def) || def[s] == a) continue
    b = def[s]; e = a " -> " b
    if (!(e in syms)) { edges[++ne] = e; from[ne] = a; to[ne] = b }
    syms[e] = syms[e] " " s
    node[a] = node[b] = 1
  }
  total = up = side = intoBk = 0
  for (i = 1; i <= ne; i++) {
    a = from[i]; b = to[i]; e = edges[i]; total++
    kind = ""
    if (!backend(a)) {
      if (backend(b)) { kind = "into a backend"; intoBk++; up++ }
      else if (!(a in rank) || !(b in rank)) kind = "unranked"
      else if (rank[b] > rank[a]) { kind = "up"; up++ }
      else if (rank[b] == rank[a]) { kind = "sideways"; side++ }
    }
    if (verbose || kind != "") printf "%-14s %s:%s\n", kind, e, syms[e]
    reach[a, b] = 1
  }
  # the circles: files that reach each other (transitive closure)
  for (k in node) for (i in node) if ((i, k) in reach) for (j in node) if ((k, j) in reach) reach[i, j] = 1
  printf "arrows %d; back up %d (into a backend by name %d); sideways %d\n", total, up, intoBk, side
  circle("largest circle", 0)
  # the same among the neutral files alone (no arrow of a backend)
  for (i = 1; i <= ne; i++) if (!backend(from[i]) && !backend(to[i])) nreach[from[i], to[i]] = 1
  for (k in node) if (!backend(k)) for (i in node) if ((i, k) in nreach) for (j in node) if ((k, j) in nreach) nreach[i, j] = 1
  circle("largest circle of neutral files", 1)
}
function circle(what, neutral,   i, j, c, m, best, members, nb) {
  best = 0
  for (i in node) {
    if (neutral && backend(i)) continue
    c = 0; m = ""
    for (j in node) {
      if (i == j) { c++; m = m " " j; continue }
      if (neutral ? (((i, j) in nreach) && ((j, i) in nreach)) : (((i, j) in reach) && ((j, i) in reach))) { c++; m = m " " j }
    }
    if (c > best) { best = c; members = m }
  }
  nb = 0
  for (i = 1; i <= ne; i++) if (index(members " ", " " from[i] " ") && index(members " ", " " to[i] " ")) nb++
  printf "%s: %d files, %d arrows:%s\n", what, best, nb, members
}'
