package nvmltest

import (
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// SetLost makes every query of GPU gpu fail with ERROR_GPU_IS_LOST, as when
// a GPU falls off the bus (XID 79), or makes it answer again.
func (m *Machine) SetLost(gpu int, lost bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.GPUs[gpu].lost = lost
}

// Registered returns the event types the code under test registered for
// on GPU gpu.
func (m *Machine) Registered(gpu int) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.GPUs[gpu].registered
}

// InjectXID delivers a critical XID error event for GPU gpu, as NVML does,
// if the code under test registered for XID events on that GPU. It reports
// whether the event was delivered.
func (m *Machine) InjectXID(gpu int, xid uint64) bool {
	return m.inject(gpu, nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: AllInstances, ComputeInstanceId: AllInstances})
}

// InjectMIGXID delivers a critical XID error event for MIG device mig of GPU
// gpu (an event that names its GPU and compute instance).
func (m *Machine) InjectMIGXID(gpu, mig int, xid uint64) bool {
	md := m.GPUs[gpu].MIGDevices[mig]
	return m.inject(gpu, nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: md.GI, ComputeInstanceId: md.CI})
}

// InjectEvent delivers an event of any type for GPU gpu.
func (m *Machine) InjectEvent(gpu int, e nvml.EventData) bool { return m.inject(gpu, e) }

func (m *Machine) inject(gpu int, e nvml.EventData) bool {
	m.mu.Lock()
	g := m.GPUs[gpu]
	registered := g.registered&e.EventType != 0
	m.mu.Unlock()
	if !registered {
		return false
	}
	e.Device = g.Device
	m.events <- e
	return true
}

// FailWait makes every wait on an event set fail with ret (SUCCESS: wait
// normally again).
func (m *Machine) FailWait(ret nvml.Return) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.waitErr = ret
}

// EventSetFreed reports whether the code under test freed its event set.
func (m *Machine) EventSetFreed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.freed
}

func (m *Machine) setMockFuncs() {
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		set := &mock.EventSet{}
		set.WaitFunc = func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			m.mu.Lock()
			ret := m.waitErr
			m.mu.Unlock()
			if ret != nvml.SUCCESS {
				return nvml.EventData{}, ret
			}
			select {
			case e := <-m.events:
				return e, nvml.SUCCESS
			case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		}
		set.FreeFunc = func() nvml.Return {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.freed = true
			return nvml.SUCCESS
		}
		return set, nvml.SUCCESS
	}
}
