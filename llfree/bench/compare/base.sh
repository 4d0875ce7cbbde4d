# Sourced by run.sh and count.sh with HERE set: checks revision $1 out as the base LLFree in a
# git worktree at $WORK/base (removed on exit), under another version so that both LLFrees fit
# in one build (Cargo keeps one package per name and version).
ROOT=$(cd "$HERE/../../.." && pwd)
WORK=$ROOT/target/llfree-compare
mkdir -p "$WORK"
git -C "$ROOT" worktree remove --force "$WORK/base" 2>/dev/null || rm -rf "$WORK/base"
git -C "$ROOT" worktree add --detach -q "$WORK/base" "$1"
trap 'git -C "$ROOT" worktree remove --force "$WORK/base"' EXIT
sed -i 's/^version.workspace = true$/version = "0.0.0-base"/' "$WORK/base/llfree/Cargo.toml"
