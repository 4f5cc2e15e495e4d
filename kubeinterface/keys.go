package kubeinterface

// Domain is the prefix of every annotation, label and resource kubegpu owns.
const Domain = "kubegpu.io/"

// Resource names: what a container puts in its limits.
const (
	// ResourceGPU is the number of GPUs (or of GPU slices, with
	// ResourceGPUMemory or ResourceGPUCores) a container asks for.
	ResourceGPU = "nvidia.com/gpu"
	// ResourceGPUMemory is the device memory, in MiB, each slice needs.
	ResourceGPUMemory = Domain + "gpu-memory"
	// ResourceGPUCores is the percentage (1..100) of a GPU's compute each
	// slice needs.
	ResourceGPUCores = Domain + "gpu-cores"
	// ResourceGPUShare is what a container's GPUs are worth in per cent of
	// a GPU, for ResourceQuota: 100 per whole GPU, and a slice's
	// ResourceGPUCores per slice. The admission policy kubegpu-gpu-share
	// sets it on every GPU container at creation. Nodes publish it inflated
	// as nvidia.com/gpu is (100 per GPU times the slices per GPU), so that
	// only quota counts it. The scheduler and the shim do not read it.
	ResourceGPUShare = Domain + "gpu-share"
	// ResourceGPUs is the node's physical GPUs, in its capacity for the
	// tools that read it (kubectl describe, autoscalers): nvidia.com/gpu
	// there counts slices. Pods do not ask for it.
	ResourceGPUs = Domain + "gpus"
)

// Intel GPU Aware Scheduling's resources, read with its meaning beside
// gpu.intel.com/i915 or gpu.intel.com/xe: the container's total, split
// evenly over its GPUs (integer division), each GPU's part a slice.
const (
	// ResourceIntelMillicores is the compute a container's GPUs give it
	// together, in thousandths of a GPU (1..1000 per GPU).
	ResourceIntelMillicores = "gpu.intel.com/millicores"
	// ResourceIntelMemoryMax is the device memory, in bytes, a
	// container's GPUs give it together.
	ResourceIntelMemoryMax = "gpu.intel.com/memory.max"
	// ResourceIntelTiles is GAS's count of tiles, which kubegpu does not
	// place: a container that asks for it is refused.
	ResourceIntelTiles = "gpu.intel.com/tiles"
)

// Namespace GPU budgets: a soft limit beside the hard quota. A pod that
// would take its namespace over its budget still runs, on idle GPUs, at a
// reduced priority, and is the first preempted when a pod within its
// budget needs the GPUs.
const (
	// BudgetQuota is the name of the ResourceQuota that sets a namespace's
	// budget in requests.kubegpu.io/gpu-share. It must be scoped to pods
	// not of PriorityClassBorrowed, so that borrowers leave its count.
	BudgetQuota = "kubegpu-budget"
	// PriorityClassBorrowed is the PriorityClass the admission policy
	// kubegpu-budget gives a GPU pod over its namespace's budget.
	PriorityClassBorrowed = "kubegpu-borrowed"
	// BorrowedPriority is PriorityClassBorrowed's value: below the default
	// priority 0, so that any pod that may preempt evicts borrowers first.
	BorrowedPriority int32 = -100
	// BorrowedGracePeriodSeconds caps a borrower's
	// terminationGracePeriodSeconds, so that it leaves its GPUs soon when
	// evicted for a pod within its budget.
	BorrowedGracePeriodSeconds = 30
)

// Pod annotations a user sets to constrain the pod's devices. Lists are
// comma-separated.
const (
	// AnnotationModelInclude lists GPU models the pod may get.
	AnnotationModelInclude = Domain + "gpu-model-include"
	// AnnotationModelExclude lists GPU models the pod must not get.
	AnnotationModelExclude = Domain + "gpu-model-exclude"
	// AnnotationUUIDInclude lists GPU UUIDs the pod may get.
	AnnotationUUIDInclude = Domain + "gpu-uuid-include"
	// AnnotationUUIDExclude lists GPU UUIDs the pod must not get.
	AnnotationUUIDExclude = Domain + "gpu-uuid-exclude"
	// AnnotationTopology is the topology policy: required, preferred or none.
	AnnotationTopology = Domain + "topology"
	// AnnotationPlacement is the placement policy: binpack or spread.
	AnnotationPlacement = Domain + "placement"
)

// LabelEnforcement on a Namespace overrides the scheduler's enforcement
// policy (its args' enforcement) for the namespace's pods: Required or
// BestEffort (types.EnforcementPolicy). A label, because namespaces are the
// cluster administrator's: tenants with the edit or admin role cannot
// change their namespace's labels.
const LabelEnforcement = Domain + "enforcement"

// LabelNamespaceClaims on a Namespace, set to NamespaceClaimsUncounted,
// lets its ResourceClaims of kubegpu's DeviceClass past a scoped
// ResourceQuota on GPU equivalents (a budget among them), which cannot
// count them (admission policy kubegpu-claim-quota). A label, as
// LabelEnforcement is: tenants cannot change it.
const (
	LabelNamespaceClaims     = Domain + "claims"
	NamespaceClaimsUncounted = "uncounted"
)

// ConditionEnforced is the pod condition kubegpu-crishim keeps, with the
// node's credentials, on a running pod with GPU slices: True (reason
// ReasonEnforced) when every slice's limits, read back from its enforcer,
// equal the grant, the message naming the mechanism and values; False with
// ReasonUnenforced (no enforcer on the node, BestEffort), ReasonMismatch
// (the enforcer holds other limits) or ReasonUnproven (the enforcer did not
// answer).
const ConditionEnforced = Domain + "Enforced"

// Reasons of ConditionEnforced.
const (
	ReasonEnforced   = "Enforced"
	ReasonUnenforced = "Unenforced"
	ReasonMismatch   = "Mismatch"
	ReasonUnproven   = "Unproven"
)

// Annotations written by kubegpu itself.
const (
	// AnnotationAllocation on a pod is the scheduler's signed PodAllocation
	// (versioned JSON, see EncodeAllocation).
	AnnotationAllocation = Domain + "allocation"
	// AnnotationInventory on a node is the node's device Inventory
	// (versioned JSON, see EncodeInventory), written by the advertiser.
	AnnotationInventory = Domain + "inventory"
)

// Labels and annotations kubegpu-crishim puts on the containers it gives
// devices, in the container runtime (not on Kubernetes objects): the node's
// ledger of what live containers hold. The shim removes any a container
// config brings itself.
const (
	// LabelContainerLedger marks a container in the ledger; its value is
	// the ledger format, LedgerVersion.
	LabelContainerLedger = Domain + "ledger"
	// LabelContainerPodUID is the UID of the container's pod.
	LabelContainerPodUID = Domain + "pod-uid"
	// AnnotationContainerDRAHeld lists, as AnnotationContainerHeld does,
	// the kubegpu devices the container's pod holds whole through
	// ResourceClaims, of another DRA driver or kubegpu's: the pods of one
	// shared claim hold them together, and no container holds them
	// through kubegpu's allocations meanwhile.
	AnnotationContainerDRAHeld = Domain + "dra-held"
	// AnnotationContainerHeld lists the devices the container holds (see
	// EncodeHeld).
	AnnotationContainerHeld = Domain + "held"
)

// LedgerVersion is the value of LabelContainerLedger.
const LedgerVersion = "v1"

// ConditionAllocated is the pod condition in which kubegpu-scheduler
// records, after binding, the allocation it signed for the pod (the same
// payload as AnnotationAllocation, in the condition's message). Tenants
// cannot write a pod's status, so the record is what the scheduler counts
// the pod's devices by, whatever becomes of the annotation.
const ConditionAllocated = Domain + "Allocated"

// ConditionDevicesReady is the Node condition kubegpu-crishim's advertiser
// keeps: True (reason ReasonModulesLoaded) while every device module in the
// node's plugin directory serves, False (reason ReasonModuleLoadFailed)
// while one did not load or start, its message naming the module and the
// error. Containers are refused the devices a failed module would serve,
// and the node's inventory lacks them.
const ConditionDevicesReady = Domain + "DevicesReady"

// Reasons of ConditionDevicesReady.
const (
	ReasonModulesLoaded    = "ModulesLoaded"
	ReasonModuleLoadFailed = "ModuleLoadFailed"
)

// ConditionDRAConflict is the Node condition kubegpu-crishim's
// advertiser keeps while it publishes: True (reason ReasonDRAConflict)
// while another DRA driver's ResourceSlices publish GPUs of the node's
// kubegpu inventory, its message naming the drivers and GPUs: the node
// gets no GPU pods from kubegpu-scheduler then; False (reason
// ReasonNoDRAConflict) otherwise.
const ConditionDRAConflict = Domain + "DRAConflict"

// Reasons of ConditionDRAConflict.
const (
	ReasonDRAConflict   = "OtherDriverPublishesGPUs"
	ReasonNoDRAConflict = "NoOtherDriver"
)

// LeaseNamespace holds each node's Lease, renewed by its kubelet and named
// as the node: the liveness kubegpu-scheduler judges a node by.
const LeaseNamespace = "kube-node-lease"

// Kinds of the versioned JSON payloads.
const (
	KindInventory  = "NodeInventory"
	KindAllocation = "PodAllocation"
)
