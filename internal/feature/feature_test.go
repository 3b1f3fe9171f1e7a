package feature

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestCheckFitNamesEveryMapThatDoesNotFit(t *testing.T) {
	caps := map[string]int{"a": 10, "b": 5, "c": 3}
	capacity := func(name string) int {
		if c, ok := caps[name]; ok {
			return c
		}
		return -1
	}
	if err := CheckFit("f", Sizes{"a": 10, "b": 5}, capacity); err != nil {
		t.Fatalf("a plan that fits exactly: %v", err)
	}
	err := CheckFit("f", Sizes{"a": 11, "b": 5, "c": 7}, capacity)
	want := []Overflow{{Map: "a", Want: 11, Capacity: 10}, {Map: "c", Want: 7, Capacity: 3}}
	if got := Overflows(fmt.Errorf("wrapped: %w", err)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("overflows %v, want %v", got, want)
	}
	if !strings.Contains(err.Error(), "c: 7 entries wanted, capacity 3 (4 did not fit)") {
		t.Fatalf("error %q does not say how many did not fit", err)
	}
	if err := CheckFit("f", Sizes{"nope": 1}, capacity); err == nil || Overflows(err) != nil {
		t.Fatalf("a map the datapath does not have: %v", err)
	}
	if Overflows(errors.New("other")) != nil {
		t.Fatal("overflows found in an unrelated error")
	}
}

type fake struct {
	name string
	bit  uint32
	maps []Map
}

func (f fake) Name() string               { return f.name }
func (f fake) Bit() uint32                { return f.bit }
func (f fake) Maps() []Map                { return f.maps }
func (f fake) Compile(Node) (Plan, error) { return nil, nil }
func (f fake) Sync(Plan) error            { return nil }

func TestCheckRefusesARegistryThatCannotWork(t *testing.T) {
	ok := []Feature{fake{name: "router", maps: []Map{{Name: "x"}}}, fake{name: "tap", bit: 1, maps: []Map{{Name: "y", Owner: Datapath, Lifetime: "LRU"}}}}
	if err := Check(ok); err != nil {
		t.Fatal(err)
	}
	for name, fs := range map[string][]Feature{
		"two of one name":    {fake{name: "a"}, fake{name: "a"}},
		"no name":            {fake{}},
		"two bits":           {fake{name: "a", bit: 3}},
		"one bit twice":      {fake{name: "a", bit: 2}, fake{name: "b", bit: 2}},
		"one map twice":      {fake{name: "a", maps: []Map{{Name: "m"}}}, fake{name: "b", maps: []Map{{Name: "m"}}}},
		"owned, no lifetime": {fake{name: "a", maps: []Map{{Name: "m", Owner: Protocol}}}},
	} {
		if err := Check(fs); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
