package policy

import (
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

var subnets = []intent.Subnet{
	{Farm: "blue", Name: "web", ID: 1}, {Farm: "blue", Name: "db", ID: 2}, {Farm: "red", Name: "web", ID: 1},
}

func TestIntraFarmRuleIsCompiledAsWritten(t *testing.T) {
	farms := []intent.Farm{
		{Name: "blue", ID: 1, Rules: []intent.Rule{{From: "blue/web", To: "blue/db", Proto: "tcp", Port: 5432}}},
		{Name: "red", ID: 2},
	}
	got := Visibility(farms, subnets)
	want := intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 5432}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("got %+v, want [%+v]", got, want)
	}
}

func TestInterFarmTrafficNeedsMutualPeeringAndBothRules(t *testing.T) {
	blueRule := intent.Rule{From: "blue/web", To: "red/web", Proto: "tcp"}
	redRule := intent.Rule{From: "blue/web", To: "red/web", Proto: "tcp", Port: 80}
	cases := []struct {
		name      string
		bluePeers []string
		redPeers  []string
		blueRules []intent.Rule
		redRules  []intent.Rule
		want      []intent.VisRule
	}{
		{"only blue peers", []string{"red"}, nil, []intent.Rule{blueRule}, []intent.Rule{redRule}, nil},
		{"both peer, only blue allows", []string{"red"}, []string{"blue"}, []intent.Rule{blueRule}, nil, nil},
		{"both peer and allow: the intersection", []string{"red"}, []string{"blue"}, []intent.Rule{blueRule}, []intent.Rule{redRule},
			[]intent.VisRule{{SrcFarm: 1, SrcSubnet: 1, DstFarm: 2, DstSubnet: 1, Proto: 6, Port: 80}}},
		{"disjoint protocols allow nothing", []string{"red"}, []string{"blue"}, []intent.Rule{blueRule},
			[]intent.Rule{{From: "blue/web", To: "red/web", Proto: "udp"}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			farms := []intent.Farm{
				{Name: "blue", ID: 1, Peers: c.bluePeers, Rules: c.blueRules},
				{Name: "red", ID: 2, Peers: c.redPeers, Rules: c.redRules},
			}
			got := Visibility(farms, subnets)
			if len(got) != len(c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %+v, want %+v", got, c.want)
				}
			}
		})
	}
}

func TestProtoNumber(t *testing.T) {
	for name, want := range map[string]uint8{"": 0, "any": 0, "icmp": 1, "TCP": 6, "udp": 17} {
		if got, err := ProtoNumber(name); err != nil || got != want {
			t.Errorf("%q: %d %v", name, got, err)
		}
	}
	if _, err := ProtoNumber("sctp"); err == nil {
		t.Error("sctp accepted")
	}
}
