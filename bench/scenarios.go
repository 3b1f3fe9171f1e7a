package main

// scenarios are the bench's scenarios, registered here, one line each, in
// the order the report lists them; each is defined in its own
// scenario_NAME.go. A scenario's baselines must be registered too.
var scenarios = []*Scenario{
	onehopScenario,
	routedScenario,
	routed2Scenario,
	routerScenario,
	router2Scenario,
	bridgeScenario,
	vethScenario,
	tapGuestScenario,
	tapGuestPlainScenario,
	cniScenario,
	sliverScenario,
	psHostScenario,
	natScenario,
	egressScenario,
	egressNATScenario,
	egressFloorScenario,
	tappedScenario,
	observedScenario,
	cloudFullScenario,
	cloudTProxyScenario,
	cloudNATScenario,
	cloudTwoScenario,
	cloudOneScenario,
	vnatBaseScenario,
	vnat1Scenario,
	vnat2Scenario,
	vnatRestoreScenario,
	apiAuthzScenario,
	traceScenario,
}
