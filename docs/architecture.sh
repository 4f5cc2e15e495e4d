#!/usr/bin/env bash
# Keeps docs/architecture.md true to the code.
#
#   docs/architecture.sh      check: the package picture is what the imports
#                             give, and every repository path the page names
#                             exists (exit 1, with what differs, if not)
#   docs/architecture.sh -w   write the package picture from the imports
#
# The picture is go list's imports between kubegpu's packages, less the
# tests' helpers, the simulator, the binaries' main packages and the tools,
# with every arrow that a path of other arrows implies left out.
set -euo pipefail
cd "$(dirname "$0")/.."
case ":$PATH:" in *:/usr/local/go/bin:*) ;; *) export PATH="$PATH:/usr/local/go/bin" ;; esac
DOC=docs/architecture.md
MODULE=github.com/kubegpu/kubegpu
BEGIN='<!-- packages: written by docs/architecture.sh -w from the imports; do not edit -->'
END='<!-- end of packages -->'
# Packages left out of the picture, as paths in the module.
LEFT_OUT='^(test|internal|demo|deploy|hack|docs)(/|$)|/internal/|test$|/cmd/|^plugins/[^/]+/plugin$|sim(/|$)|^utils/(version|plugintest)$|/nvmllib$'

packages() {
	go list -f '{{.ImportPath}}{{range .Imports}} {{.}}{{end}}' ./... |
		awk -v mod="$MODULE/" -v out="$LEFT_OUT" '
		function keep(p) { return index(p, mod) == 1 && substr(p, length(mod) + 1) !~ out }
		function id(p) { gsub(/[\/-]/, "_", p); return p }
		function reach(from, to,    k, parts) {
			# Whether to can be reached from from (memoised per pair).
			if ((from, to) in memo) return memo[from, to]
			memo[from, to] = 0
			for (k in adj) {
				split(k, parts, SUBSEP)
				if (parts[1] == from && (parts[2] == to || reach(parts[2], to))) { memo[from, to] = 1; break }
			}
			return memo[from, to]
		}
		keep($1) {
			a = substr($1, length(mod) + 1); nodes[a] = 1
			for (i = 2; i <= NF; i++) if (keep($i)) adj[a, substr($i, length(mod) + 1)] = 1
		}
		END {
			# Only what is drawn counts: an import of a package left out
			# is no arrow.
			for (k in adj) { split(k, e, SUBSEP); if (!(e[2] in nodes)) delete adj[k] }
			for (n in nodes) {
				top = n; sub(/\/.*/, "", top); count[top]++
			}
			# Sort keys: the box of the component (or "~" for packages alone
			# in theirs, "~~" for arrows), then the place of the line in it.
			for (n in nodes) {
				top = n; sub(/\/.*/, "", top)
				if (count[top] > 1) printf "%s\t1\t    %s[\"%s\"]\n", top, id(n), n
				else printf "~\t1\t  %s[\"%s\"]\n", id(n), n
			}
			for (top in count) if (count[top] > 1) {
				printf "%s\t0\t  subgraph %s_ [%s/]\n", top, id(top), top
				printf "%s\t2\t  end\n", top
			}
			for (k in adj) {
				split(k, e, SUBSEP)
				implied = 0
				for (k2 in adj) {
					split(k2, f, SUBSEP)
					if (f[1] == e[1] && f[2] != e[2] && reach(f[2], e[2])) { implied = 1; break }
				}
				if (!implied) printf "~~\t3\t  %s --> %s\n", id(e[1]), id(e[2])
			}
		}' | LC_ALL=C sort -t "$(printf '\t')" -k1,1 -k2,2n -k3,3 | cut -f3
}

block() {
	echo "$BEGIN"
	echo '```mermaid'
	echo 'flowchart TB'
	packages
	echo '```'
	echo "$END"
}

current() {
	awk -v b="$BEGIN" -v e="$END" '$0 == b { on = 1 } on { print } $0 == e { on = 0 }' "$DOC"
}

if [ "${1:-}" = -w ]; then
	new=$(block)
	awk -v b="$BEGIN" -v e="$END" -v new="$new" '
		$0 == b { print new; skip = 1; next }
		$0 == e { skip = 0; next }
		!skip { print }' "$DOC" >"$DOC.tmp"
	mv "$DOC.tmp" "$DOC"
	exit 0
fi

fail=0
if ! diff -u <(current) <(block) >/tmp/architecture.$$.diff; then
	echo "docs/architecture.md: the package picture is not what the imports give (docs/architecture.sh -w writes it):"
	cat /tmp/architecture.$$.diff
	fail=1
fi
rm -f /tmp/architecture.$$.diff
# Every path the page names, in text, pictures and links (relative to docs/).
missing=$(sed 's#\.\./##g' "$DOC" |
	grep -oE '(^|[^A-Za-z0-9_./-])(types|kubeinterface|device-scheduler|kube-scheduler|crishim|plugins|utils|cli|deploy|docs|hack|test|internal)/[A-Za-z0-9_.*/-]*' |
	sed -E 's#^[^A-Za-z]##; s#[.]$##' | LC_ALL=C sort -u |
	while read -r p; do compgen -G "$p" >/dev/null || echo "  $p"; done)
if [ -n "$missing" ]; then
	echo "docs/architecture.md names paths that do not exist:"
	echo "$missing"
	fail=1
fi
exit $fail
