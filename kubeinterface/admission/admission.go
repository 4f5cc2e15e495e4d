package admission

import (
	"bytes"
	"fmt"
	"strings"
	"text/template"

	"github.com/kubegpu/kubegpu/kubeinterface"
	"github.com/kubegpu/kubegpu/kubeinterface/dra"
	"github.com/kubegpu/kubegpu/kubeinterface/objects"
	"github.com/kubegpu/kubegpu/types"
)

// The virtual permissions the policies ask the authorizer for. Nothing
// serves these resources; RBAC rules name them so that (Cluster)Role
// bindings decide who may do what the policies guard.
const (
	// Group is the API group of the virtual permissions.
	Group = "kubegpu.io"
	// WriteAllocations: "write" on "allocations" lets an identity set
	// kubegpu.io/allocation on an unbound pod and the record in a pod's
	// status: kubegpu-scheduler's identity (kube-scheduler/deploy/rbac.yaml).
	WriteAllocations = "allocations"
	// SetNodeName: "set" on "pods/nodename" lets an identity create GPU
	// pods with spec.nodeName (the ClusterRole kubegpu-node-name-setter).
	SetNodeName = "pods/nodename"
)

// Policies returns deploy/admission/kubegpu-policies.yaml: the policies
// every kubegpu cluster installs, their bindings, and the ClusterRole that
// exempts operators from kubegpu-node-name.
func Policies() ([]byte, error) { return render(policiesTemplate, newData("")) }

// SecondSchedulerPolicy returns deploy/admission/second-scheduler.yaml:
// the policy, for clusters where kubegpu-scheduler runs beside the stock
// scheduler under schedulerName, that refuses GPU pods addressed to any
// other scheduler.
func SecondSchedulerPolicy(schedulerName string) ([]byte, error) {
	return render(secondSchedulerTemplate, newData(schedulerName))
}

// HelmSecondSchedulerPolicy returns the Helm chart's template of
// SecondSchedulerPolicy: the scheduler's name is the chart's value
// schedulerName (which values.schema.json limits to a DNS label), and the
// policy is rendered only in the chart's mode second.
func HelmSecondSchedulerPolicy() ([]byte, error) {
	b, err := SecondSchedulerPolicy("{{ .Values.schedulerName }}")
	if err != nil {
		return nil, err
	}
	// Not kept by helm uninstall, unlike the chart's other policies: it
	// must go with the release, or with a change to mode only, where it
	// would refuse every GPU pod.
	return append(append([]byte(`{{- if and .Values.admissionPolicies.install (eq .Values.mode "second") }}
`), b...), "{{- end }}\n"...), nil
}

// data is what the templates are rendered with.
type data struct {
	Group, WriteAllocations, SetNodeName, SchedulerName string
}

func newData(schedulerName string) data {
	return data{Group: Group, WriteAllocations: WriteAllocations, SetNodeName: SetNodeName, SchedulerName: schedulerName}
}

// render executes the template of templateFiles named name.
func render(name string, data any) ([]byte, error) {
	t, err := template.New("").Funcs(funcs).ParseFS(templateFiles, "templates/*.tmpl")
	if err != nil {
		return nil, fmt.Errorf("parse policy templates: %w", err)
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, name, data); err != nil {
		return nil, fmt.Errorf("render policy: %w", err)
	}
	return b.Bytes(), nil
}

var funcs = template.FuncMap{
	"str":   celString,
	"quote": celQuote,
	"val":   celValue,
	"intok": celIntOK,
	"list":  celList,
	"rules": func() rules { return theRules },
	"lst":   func(s ...string) []string { return s },
	"cat":   func(a []string, s ...string) []string { return append(append([]string(nil), a...), s...) },
	"asked": celAsked,
	"obj":   func(o string, r rules) objectRules { return objectRules{O: o, R: r} },
	"join":  func(s []string) string { return strings.Join(s, ", ") },
}

// celString is s as a CEL string literal.
func celString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// celList is a CEL list literal of strings.
func celList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = celString(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// celQuote is the CEL expression of kubeinterface.Quote(v), for v a CEL
// string expression.
func celQuote(v string) string {
	n := kubeinterface.MaxQuotedChars
	printable := func(s string) string { return s + ".matches('^[ -~]*$')" }
	described := fmt.Sprintf("'(' + string(size(%s)) + ' characters, not all printable ASCII)'", v)
	prefix := fmt.Sprintf("%s.substring(0, %d)", v, n)
	return fmt.Sprintf(`(size(%[1]s) > %[2]d ? (%[3]s ? '"' + %[4]s + '"... (' + string(size(%[1]s)) + ' characters)' : %[5]s) : (%[6]s ? '"' + %[1]s + '"' : %[5]s))`,
		v, n, printable(prefix), prefix, described, printable(v))
}

// celValue is the CEL expression of container c's quantity of resource r,
// from its limits or else its requests, as a string (” if unset).
func celValue(c, r string) string {
	return fmt.Sprintf("string(%[1]s.?resources.?limits[?%[2]s].orValue(%[1]s.?resources.?requests[?%[2]s].orValue('')))", c, celString(r))
}

// celIntOK is the CEL test that quantity string v is an integer in lo..hi.
func celIntOK(v string, lo, hi int64) string {
	return fmt.Sprintf("(%[1]s != '' && sign(quantity(%[1]s)) >= 0 && quantity(%[1]s).isInteger() && quantity(%[1]s).asInteger() >= %[2]d && quantity(%[1]s).asInteger() <= %[3]d)", v, lo, hi)
}

// celAsked is the CEL list of the device resources container c asks for
// devices of (a count in 1..MaxDevices; an invalid count is an error of
// its own), in r.Devices' order, as objects.PodRequest finds them.
func celAsked(c string, r rules) string {
	items := make([]string, len(r.Devices))
	for i, d := range r.Devices {
		items[i] = fmt.Sprintf("(%s ? %s : '')", celIntOK(celValue(c, d), 1, r.MaxDevices), celString(d))
	}
	return "[" + strings.Join(items, ", ") + "].filter(r, r != '')"
}

// objectRules are the rules applied to the CEL variable O.
type objectRules struct {
	O string
	R rules
}

// rules are the request rules' bounds and words, from kubeinterface/objects.
type rules struct {
	Devices, Intel                       []string
	DeviceNames, FieldResources, WantOne string
	Milli, MemMax, Tiles                 string
	MaxMilli, MaxMemMax                  int64
	WantMilli, WantMemMax, WantNoTiles   string
	WantOneWay, WantIntel                string
	WantMilliPerGPU, WantMemMaxPerGPU    string
	SliceMilli, SliceMemMax              string
	Memory, Cores, Share, GPUs           string
	MaxDevices, MaxMemory, MaxCores      int64
	WantCount, WantMemory, WantCores     string
	MaxListChars, MaxListEntries         int
	WantChars, WantASCII, WantNoEmpty    string
	WantEntries, WantDisjoint, WantKnown string
	Lists                                []listRule
	Topology, Placement                  string
	Topologies, Placements               []string
	Known                                []string
	Allocation, Record, Enforced         string
	MaxContainers                        int
	FieldContainers, WantContainers      string
	FieldGrace, WantGrace                string
	SliceMemory, SliceCores              string
	Domain                               string
	Budget, Borrowed                     string
	BorrowedPriority                     int32
	BorrowedGrace                        int
	ClaimClass, ClaimDevices             string
	ClaimsLabel, ClaimsAllowed           string
}

// listRule is one model or UUID list annotation and the variables named
// after it.
type listRule struct {
	Key, Var string
	// Exclude is the variable of the matching -exclude list, for an
	// -include list.
	Exclude string
}

var theRules = func() rules {
	r := rules{
		Devices: types.DeviceResources(), DeviceNames: objects.FieldSliceCount,
		FieldResources: objects.FieldDeviceResources, WantOne: objects.WantOneResource,
		Intel: []string{types.ResourceIntelI915, types.ResourceIntelXe},
		Milli: kubeinterface.ResourceIntelMillicores, MemMax: kubeinterface.ResourceIntelMemoryMax, Tiles: kubeinterface.ResourceIntelTiles,
		MaxMilli: 1000 * objects.MaxDevicesPerContainer, MaxMemMax: objects.MaxMemoryMaxBytes,
		WantMilli: objects.WantMillicores, WantMemMax: objects.WantMemoryMax, WantNoTiles: objects.WantNoTiles,
		WantOneWay: objects.WantOneSliceWay, WantIntel: objects.WantIntelCount,
		WantMilliPerGPU: objects.WantMillicoresPerGPU, WantMemMaxPerGPU: objects.WantMemoryMaxPerGPU,
		SliceMilli: objects.WantSliceCount(kubeinterface.ResourceIntelMillicores), SliceMemMax: objects.WantSliceCount(kubeinterface.ResourceIntelMemoryMax),
		Memory: kubeinterface.ResourceGPUMemory, Cores: kubeinterface.ResourceGPUCores, Share: kubeinterface.ResourceGPUShare,
		GPUs:       kubeinterface.ResourceGPUs,
		MaxDevices: objects.MaxDevicesPerContainer, MaxMemory: objects.MaxSliceMemoryMiB, MaxCores: types.MaxComputePercent,
		WantCount: objects.WantDeviceCount, WantMemory: objects.WantSliceMemory, WantCores: objects.WantSliceCores,
		MaxListChars: objects.MaxListChars, MaxListEntries: objects.MaxListEntries,
		WantChars: objects.WantListChars, WantASCII: objects.WantListASCII, WantNoEmpty: objects.WantListNoEmpty,
		WantEntries: objects.WantListEntries, WantDisjoint: objects.WantDisjoint, WantKnown: objects.WantKnownAnnotation,
		Topology: kubeinterface.AnnotationTopology, Placement: kubeinterface.AnnotationPlacement,
		Known:      objects.KnownAnnotations(),
		Allocation: kubeinterface.AnnotationAllocation, Record: kubeinterface.ConditionAllocated, Enforced: kubeinterface.ConditionEnforced,
		MaxContainers:   types.MaxDeviceContainers,
		FieldContainers: objects.FieldDeviceContainers, WantContainers: objects.WantDeviceContainers,
		FieldGrace: objects.FieldGracePeriod, WantGrace: objects.WantGracePeriod,
		SliceMemory: objects.WantSliceCount(kubeinterface.ResourceGPUMemory), SliceCores: objects.WantSliceCount(kubeinterface.ResourceGPUCores),
		Domain: kubeinterface.Domain,
		Budget: kubeinterface.BudgetQuota, Borrowed: kubeinterface.PriorityClassBorrowed, BorrowedPriority: kubeinterface.BorrowedPriority,
		BorrowedGrace: kubeinterface.BorrowedGracePeriodSeconds,
		ClaimClass:    dra.ClassName, ClaimDevices: dra.DevicesQuota,
		ClaimsLabel: kubeinterface.LabelNamespaceClaims, ClaimsAllowed: kubeinterface.NamespaceClaimsUncounted,
	}
	for _, t := range types.TopologyPolicies {
		r.Topologies = append(r.Topologies, string(t))
	}
	for _, p := range types.PlacementPolicies {
		r.Placements = append(r.Placements, string(p))
	}
	vars := map[string]string{
		kubeinterface.AnnotationModelInclude: "modelInclude", kubeinterface.AnnotationModelExclude: "modelExclude",
		kubeinterface.AnnotationUUIDInclude: "uuidInclude", kubeinterface.AnnotationUUIDExclude: "uuidExclude",
	}
	for _, key := range objects.ListAnnotations {
		r.Lists = append(r.Lists, listRule{Key: key, Var: vars[key]})
	}
	r.Lists[0].Exclude, r.Lists[2].Exclude = r.Lists[1].Var, r.Lists[3].Var
	return r
}()
