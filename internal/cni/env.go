package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"

	"github.com/onehop/onehop/internal/intent"
)

// Commands of the spec.
const (
	CmdAdd     = "ADD"
	CmdDel     = "DEL"
	CmdCheck   = "CHECK"
	CmdStatus  = "STATUS"
	CmdVersion = "VERSION"
	CmdGC      = "GC"
)

// Env is what the runtime says in the environment.
type Env struct {
	Command     string // CNI_COMMAND
	ContainerID string // CNI_CONTAINERID
	Netns       string // CNI_NETNS: a path, /run/netns/NAME or /proc/PID/ns/net
	IfName      string // CNI_IFNAME: the interface's name inside the container
	// Args are CNI_ARGS' KEY=VALUE pairs (K8S_POD_NAME, ...).
	Args map[string]string
}

// containerIDRE is the spec's container id: alphanumerics, then also '_',
// '.' and '-'.
var containerIDRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// ParseEnv reads the environment through getenv and checks what the
// command needs: ADD and CHECK need the container, its namespace and its
// interface; DEL does not need the namespace (it may be gone).
func ParseEnv(getenv func(string) string) (Env, error) {
	e := Env{Command: getenv("CNI_COMMAND"), ContainerID: getenv("CNI_CONTAINERID"), Netns: getenv("CNI_NETNS"), IfName: getenv("CNI_IFNAME")}
	switch e.Command {
	case CmdAdd, CmdDel, CmdCheck:
	case CmdStatus, CmdVersion, CmdGC:
		return e, nil
	case "":
		return e, errorf(ErrInvalidEnvironment, "CNI_COMMAND is not set")
	default:
		return e, errorf(ErrInvalidEnvironment, "CNI_COMMAND %q: want ADD, DEL, CHECK, STATUS, VERSION or GC", e.Command)
	}
	if e.ContainerID == "" {
		return e, errorf(ErrInvalidEnvironment, "CNI_CONTAINERID is not set (%s needs the container's id)", e.Command)
	}
	if !containerIDRE.MatchString(e.ContainerID) {
		return e, errorf(ErrInvalidEnvironment, "CNI_CONTAINERID %q: a container id is letters, digits, '_', '.' and '-', starting with a letter or digit", e.ContainerID)
	}
	if e.IfName == "" {
		return e, errorf(ErrInvalidEnvironment, "CNI_IFNAME is not set (%s needs the container's interface name)", e.Command)
	}
	if err := intent.CheckInterface("CNI_IFNAME", e.IfName); err != nil {
		return e, &Error{Code: ErrInvalidEnvironment, Msg: err.Error()}
	}
	if e.Netns == "" && e.Command != CmdDel {
		return e, errorf(ErrInvalidEnvironment, "CNI_NETNS is not set (%s needs the container's network namespace)", e.Command)
	}
	args, err := parseArgs(getenv("CNI_ARGS"))
	if err != nil {
		return e, err
	}
	e.Args = args
	return e, nil
}

// parseArgs reads CNI_ARGS: KEY=VALUE pairs separated by ';'.
func parseArgs(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, errorf(ErrInvalidEnvironment, "CNI_ARGS: %q is not KEY=VALUE", pair)
		}
		out[k] = v
	}
	return out, nil
}

// VMName is the name of the container's VM in the intent, within the 11
// characters of a VM name: from the pod's name when CNI_ARGS has
// K8S_POD_NAME (its first five letters and digits, then hex digits of a
// hash of the pod's namespace, name and the container id up to 11,
// "web1a0b1c2d"),
// else "c" and ten hex digits of a hash of the container id. The container
// id is in the hash either way: a late DEL of a pod's old sandbox must
// not remove its new one. DEL computes the same name from the same
// environment.
func VMName(containerID string, args map[string]string) string {
	pod := args["K8S_POD_NAME"]
	if pod == "" {
		sum := sha256.Sum256([]byte(containerID))
		return "c" + hex.EncodeToString(sum[:])[:10]
	}
	var prefix []byte
	for _, r := range strings.ToLower(pod) {
		if len(prefix) == 5 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			prefix = append(prefix, byte(r))
		}
	}
	if len(prefix) == 0 || prefix[0] < 'a' {
		prefix = append([]byte{'p'}, prefix...)
		if len(prefix) > 5 {
			prefix = prefix[:5]
		}
	}
	sum := sha256.Sum256([]byte(args["K8S_POD_NAMESPACE"] + "/" + pod + "/" + containerID))
	return string(prefix) + hex.EncodeToString(sum[:])[:11-len(prefix)]
}
