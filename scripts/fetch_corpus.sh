#!/usr/bin/env bash
# Fetch the default corpus from Debian packages into data/corpus (idempotent).
#   default: the R manuals of r-doc-pdf (7 PDFs, 677 pages), without the 2415-page refman
#   FULL=1:  all of the eval corpus: + refman + 8 PDFs of texlive-publishers-doc (213 MB .deb)
set -euo pipefail
dest=${1:-}
case "$dest" in /*|"") ;; *) dest="$PWD/$dest" ;; esac  # a folder named: where it was run
cd "$(dirname "$0")/.."
dest=${dest:-data/corpus}  # the default: the repository's
full=${FULL:-0}
case "$full" in 0|1) ;; *) echo "FULL=$full: 0 (the R manuals) or 1 (the whole eval corpus)" >&2; exit 2 ;; esac
debs=data/debs
mkdir -p "$dest" "$debs"
# Packages unpack into a folder of this run's own: two runs at once (make corpus beside a test
# fixture's) never remove or overwrite what the other is copying from.
work=$(mktemp -d "$debs/unpacked.XXXXXX")
trap 'rm -rf "$work"' EXIT
rm -rf "$debs/r-doc-pdf" "$debs/texlive-publishers-doc"  # where earlier versions unpacked

whole() {  # every named PDF there and complete (a copy cut short has no %%EOF at its end)
  local f
  for f in "$@"; do
    [ -f "$dest/$f" ] && tail -c 2048 "$dest/$f" | grep -q '%%EOF' || return 1
  done
}

place() {  # copy through a temporary name: never a half-copied PDF under the real one
  local part
  part="$dest/.$(basename "$1").part"
  cp "$1" "$part" && mv "$part" "$dest/$(basename "$1")" || { rm -f "$part"; return 1; }
}

fetch() {  # package, sha256 of the .deb as recorded in the eval corpus manifest
  local pkg=$1 sha=$2 deb
  deb=$(ls "$debs"/"${pkg}"_*.deb 2>/dev/null | head -n1 || true)
  if [ -z "$deb" ]; then
    command -v apt-get >/dev/null || { echo "apt-get is needed to fetch $pkg" >&2; exit 1; }
    (cd "$debs" && { apt-get download "$pkg" 2>/dev/null || { apt-get update -qq && apt-get download "$pkg"; }; })
    deb=$(ls "$debs"/"${pkg}"_*.deb | head -n1)
  fi
  if [ -n "$sha" ] && ! echo "$sha  $deb" | sha256sum -c --quiet -; then
    echo "warning: $deb does not match the corpus manifest's sha256 (a newer package?)" >&2
  fi
  dpkg-deb -x "$deb" "$work/$pkg"
}

manuals=(R-intro.pdf R-data.pdf R-admin.pdf R-exts.pdf R-FAQ.pdf R-ints.pdf R-lang.pdf)
[ "$full" = 1 ] && manuals+=(refman.pdf)
if ! whole "${manuals[@]}"; then
  fetch r-doc-pdf beb104ad5818d261f280a868294645ca31d7c63365f2c9a55aa3ca9aad5aa71d
  # fullrefman.pdf is a text-identical duplicate of refman.pdf: never both.
  for f in "${manuals[@]}"; do
    place "$work/r-doc-pdf/usr/share/R/doc/manual/$f"
  done
fi
samples=(acmart/samples/sample-sigconf.pdf tugboat/ltubguid.pdf elsarticle/elsdoc.pdf
         aastex/sample631.pdf mnras/mnras_guide.pdf jacow/JACoW_LaTeX_A4.pdf
         ieeetran/testflow_doc.pdf revtex/sample/aps/apssamp.pdf)
if [ "$full" = 1 ] && ! whole "${samples[@]##*/}"; then
  fetch texlive-publishers-doc 9b632913d4b0d0871bef41c414fc7ce1167e3bacb55b140901df0c95df1c5765
  base="$work/texlive-publishers-doc/usr/share/doc/texlive-doc/latex"
  for p in "${samples[@]}"; do
    place "$base/$p"
  done
fi
echo "corpus: $(ls "$dest"/*.pdf | wc -l) PDFs in $dest"
