package lab

import (
	"fmt"
	"sort"
	"strings"
)

// Links and cuts: `onehop lab link NAME down|up` cuts a wide-area path of a
// cloud-access lab and restores it. A cut takes both of the WAN router's
// links down, so the gateway's and the xTR's ends lose their carrier, as
// when a provider's line fails; nothing else changes (the shaping stays).

// Links lists the links lab st can cut, sorted.
func Links(st *State) []string {
	var out []string
	for node, kind := range st.Kinds {
		if kind == "wan" {
			out = append(out, node)
		}
	}
	sort.Strings(out)
	return out
}

// SetLink cuts (up false) or restores (up true) the link name of lab st.
func SetLink(st *State, name string, up bool) error {
	if st.Kinds[name] != "wan" {
		links := Links(st)
		if len(links) == 0 {
			return fmt.Errorf("lab %s has no link %q: it has no wans (links are the wide-area paths of a cloud-access lab)", st.Name, name)
		}
		return fmt.Errorf("lab %s has no link %q (its links: %s)", st.Name, name, strings.Join(links, ", "))
	}
	ns := NamespaceOf(st.Name, name)
	for _, dev := range []string{wanGatewaySide, wanXTRSide} {
		if err := setLinkUp(ns, dev, up); err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
	}
	return nil
}

// LinkUp reports whether link name of lab st is up (both its ends).
func LinkUp(st *State, name string) (bool, error) {
	if st.Kinds[name] != "wan" {
		return false, fmt.Errorf("lab %s has no link %q (its links: %s)", st.Name, name, strings.Join(Links(st), ", "))
	}
	for _, dev := range []string{wanGatewaySide, wanXTRSide} {
		up, err := linkUp(NamespaceOf(st.Name, name), dev)
		if err != nil || !up {
			return false, err
		}
	}
	return true, nil
}
