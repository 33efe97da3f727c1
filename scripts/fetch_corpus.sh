#!/usr/bin/env bash
# Fetch the default corpus from Debian packages into data/corpus (idempotent).
#   default: the R manuals of r-doc-pdf (7 PDFs, 677 pages), without the 2415-page refman
#   FULL=1:  all of the eval corpus: + refman + 8 PDFs of texlive-publishers-doc (213 MB .deb)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-data/corpus}
full=${FULL:-0}
debs=data/debs
mkdir -p "$dest" "$debs"

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
  rm -rf "$debs/$pkg" && dpkg-deb -x "$deb" "$debs/$pkg"
}

if [ ! -f "$dest/R-data.pdf" ] || { [ "$full" = 1 ] && [ ! -f "$dest/refman.pdf" ]; }; then
  fetch r-doc-pdf beb104ad5818d261f280a868294645ca31d7c63365f2c9a55aa3ca9aad5aa71d
  for f in R-intro R-data R-admin R-exts R-FAQ R-ints R-lang; do
    cp "$debs/r-doc-pdf/usr/share/R/doc/manual/$f.pdf" "$dest/"
  done
  # fullrefman.pdf is a text-identical duplicate of refman.pdf: never both.
  [ "$full" = 1 ] && cp "$debs/r-doc-pdf/usr/share/R/doc/manual/refman.pdf" "$dest/"
fi
if [ "$full" = 1 ] && [ ! -f "$dest/apssamp.pdf" ]; then
  fetch texlive-publishers-doc 9b632913d4b0d0871bef41c414fc7ce1167e3bacb55b140901df0c95df1c5765
  base="$debs/texlive-publishers-doc/usr/share/doc/texlive-doc/latex"
  for p in acmart/samples/sample-sigconf.pdf tugboat/ltubguid.pdf elsarticle/elsdoc.pdf \
           aastex/sample631.pdf mnras/mnras_guide.pdf jacow/JACoW_LaTeX_A4.pdf \
           ieeetran/testflow_doc.pdf revtex/sample/aps/apssamp.pdf; do
    cp "$base/$p" "$dest/"
  done
fi
rm -rf "$debs"/*/
echo "corpus: $(ls "$dest"/*.pdf | wc -l) PDFs in $dest"
