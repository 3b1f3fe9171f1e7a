package topology

// uplinksSection gives every host's extra uplinks (uplinks: 2 and more)
// their fabric addresses. It has no key of its own and comes last, so these
// addresses are allocated after every other one: a lab that adds an uplink
// to a host moves no other node's address.
var uplinksSection = section{
	validate: func(c *checker, f *File) {
		for i := range f.Hosts {
			h := &f.Hosts[i]
			h.UplinkAddrs = []string{h.Address}
			for k := 1; k < h.Uplinks; k++ {
				h.UplinkAddrs = append(h.UplinkAddrs, c.allocate(h.Line, "host "+h.Name+" "+UplinkName(k), 10+len(f.Hosts)))
			}
		}
	},
}
