# Sourced by scripts/gpu_check.sh: makes the GPU recipe (`make gpu-wheels`, RECIPE, default
# .gpu-wheels) importable by PYTHON from OUT/site, and servelab too where it is not installed
# (a wheel of this tree, built with the machine's setuptools); sets TOKENIZER to the override
# that reads the recipe's tokenizer. The wheels are built for one Python (RECIPE/python-version)
# and unpacked only for that one: orjson's compiled module, say, does not load on another.
RECIPE=${RECIPE:-.gpu-wheels}
SITE="$OUT/site"
mkdir -p "$SITE"
PY_VERSION=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
RECIPE_VERSION=$(cat "$RECIPE/python-version" 2> /dev/null)
if [[ $PY_VERSION == "$RECIPE_VERSION" ]] && ls "$RECIPE"/*.whl > /dev/null 2>&1; then
  for wheel in "$RECIPE"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$SITE"; done
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  echo "the GPU recipe's wheels: loaded for Python $PY_VERSION"
elif [[ -n $RECIPE_VERSION ]]; then
  echo "the GPU recipe's wheels are for Python $RECIPE_VERSION, this is $PY_VERSION: not loaded"
fi
TOKENIZER=()  # the borrowed tokenizer that travels with the recipe: dummy runs download nothing
if [[ -f $RECIPE/tokenizer/tokenizer.json ]]; then
  TOKENIZER=("model.tokenizer=$(cd "$RECIPE/tokenizer" && pwd)")
fi
if ! "$PYTHON" -c "import servelab.harness" 2> /dev/null; then  # no install here: build one
  "$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$OUT/wheel" . &&
    "$PYTHON" -m zipfile -e "$OUT"/wheel/servelab-*.whl "$SITE" || exit 1
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
