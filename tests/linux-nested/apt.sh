# Shared by run.sh and check-install.sh: the Debian archive this machine installs from, and
# the backports suite of that same archive. Sourced; defines functions only.

# The Debian archive this machine installs from: the first URI of its configured apt sources
# that serves the release's own suite (one-line and deb822 sources alike).
debian_mirror() {
    local codename
    codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
    {
        # One-line sources: deb [options] URI SUITE COMPONENTS...
        cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            sed -E 's/\[[^]]*\]//' |
            awk -v suite="$codename" '$1 == "deb" && $3 == suite { print $2 }' || true
        # deb822 sources: a stanza's URIs and Suites fields.
        cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
            awk -v suite="$codename" '
                /^[[:space:]]*$/ { if (uri != "" && has) print uri; uri = ""; has = 0; next }
                /^URIs:/ { uri = $2 }
                /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) has = 1 }
                END { if (uri != "" && has) print uri }' || true
    } | awk 'NR == 1'
}

# Adds suite $1 (e.g. bookworm-backports) of the machine's own Debian archive to apt's
# sources, unless some source names it already.
add_suite_source() {
    local suite=$1 mirror
    grep -rqs "$suite" /etc/apt/sources.list /etc/apt/sources.list.d && return
    mirror=$(debian_mirror)
    if [ -z "$mirror" ]; then
        echo "error: no configured apt source serves $(. /etc/os-release && echo "$VERSION_CODENAME")" >&2
        return 1
    fi
    echo "== adding $suite from $mirror" >&2
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
        "$mirror" "$suite" /usr/share/keyrings/debian-archive-keyring.gpg \
        >"/etc/apt/sources.list.d/$suite.sources"
}
