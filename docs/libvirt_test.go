package docs

import (
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

// guestsSection is the text of the "## TITLE" section of docs/guests.md, up
// to the next "## " heading.
func guestsSection(t *testing.T, title string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "guests.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("docs/guests.md has no %q section", "## "+title)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// fenced is every code block of the given language in text.
func fenced(text, lang string) []string {
	var blocks []string
	for {
		_, rest, ok := strings.Cut(text, "```"+lang+"\n")
		if !ok {
			return blocks
		}
		block, after, _ := strings.Cut(rest, "```")
		blocks = append(blocks, block)
		text = after
	}
}

// libvirtDomain is what the page says about the domain's NIC.
type libvirtDomain struct {
	Interfaces []struct {
		Type   string `xml:"type,attr"`
		Target struct {
			Dev     string `xml:"dev,attr"`
			Managed string `xml:"managed,attr"`
		} `xml:"target"`
		MAC struct {
			Address string `xml:"address,attr"`
		} `xml:"mac"`
		Model struct {
			Type string `xml:"type,attr"`
		} `xml:"model"`
	} `xml:"devices>interface"`
}

// validDomain runs libvirt's own schema check on a domain XML document.
func validDomain(t *testing.T, doc string) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("virt-xml-validate", path, "domain").CombinedOutput()
	return string(out), err
}

// The libvirt domain docs/guests.md shows passes libvirt's schema, and its
// NIC is what the page says: a tap of type 'ethernet' that libvirt opens
// but does not manage, named as the VM's interface, with the VM's MAC and a
// virtio model. A broken copy fails the same check, so the check is live.
func TestTheLibvirtDomainInTheGuestsPageValidates(t *testing.T) {
	testenv.RequireTool(t, "virt-xml-validate", "xmllint")
	blocks := fenced(guestsSection(t, "libvirt"), "xml")
	if len(blocks) != 1 {
		t.Fatalf("the libvirt section has %d xml blocks, want the one domain", len(blocks))
	}
	doc := blocks[0]
	if out, err := validDomain(t, doc); err != nil {
		t.Fatalf("virt-xml-validate: %v\n%s\n%s", err, out, doc)
	}
	var d libvirtDomain
	if err := xml.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Interfaces) != 1 {
		t.Fatalf("the domain has %d interfaces, want 1", len(d.Interfaces))
	}
	nic := d.Interfaces[0]
	if nic.Type != "ethernet" || nic.Target.Managed != "no" || nic.Model.Type != "virtio" {
		t.Errorf("interface type=%q target managed=%q model=%q, want ethernet, no, virtio", nic.Type, nic.Target.Managed, nic.Model.Type)
	}
	section := guestsSection(t, "libvirt")
	for _, want := range []string{
		"--interface " + nic.Target.Dev,                     // the VM's interface in intent
		"ip tuntap add dev " + nic.Target.Dev + " mode tap", // the tap libvirt opens
		"MAC " + nic.MAC.Address,                            // the MAC vm create printed
	} {
		if !strings.Contains(section, want) {
			t.Errorf("the libvirt section has no %q: its commands and its XML disagree", want)
		}
	}

	broken := strings.Replace(doc, "managed='no'", "managed='maybe'", 1)
	if broken == doc {
		t.Fatal("no managed='no' in the domain to break")
	}
	if out, err := validDomain(t, broken); err == nil {
		t.Errorf("virt-xml-validate passed a domain with managed='maybe':\n%s", out)
	}
}
