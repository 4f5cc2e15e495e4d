package sim

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParsePods(t *testing.T) {
	in := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n" +
		"p0,12000,16384,1,460,,LS,Running,0,12537496,0\n" +
		"p1,6000,12288,8,1000,V100M16|V100M32,LS,Running,1,2,3\n" +
		"p2,0,0,0,0,,BE,Running,1,2,3\n" +
		"p3,100,10,1,1500,|T4|,LS,Running,1,2,3\n"
	got, err := ParsePods("pods.csv", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []PodSpec{
		{Name: "p0", CPUMilli: 12000, MemoryMiB: 16384, NumGPU: 1, GPUMilli: 460},
		{Name: "p1", CPUMilli: 6000, MemoryMiB: 12288, NumGPU: 8, GPUMilli: 1000, GPUSpec: []string{"V100M16", "V100M32"}},
		{Name: "p2"},
		{Name: "p3", CPUMilli: 100, MemoryMiB: 10, NumGPU: 1, GPUMilli: 1000, GPUSpec: []string{"T4"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParsePods() =\n%+v\nwant\n%+v", got, want)
	}
	if got[1].TotalGPUMilli() != 8000 {
		t.Errorf("TotalGPUMilli() = %d", got[1].TotalGPUMilli())
	}
}

func TestParsePodsFiveColumns(t *testing.T) {
	got, err := ParsePods("multigpu.csv", strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,2,2,1000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].NumGPU != 2 || got[0].GPUSpec != nil {
		t.Errorf("ParsePods() = %+v", got)
	}
}

func TestParseNodes(t *testing.T) {
	in := "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,262144,0,\n"
	got, err := ParseNodes("nodes.csv", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeSpec{{Name: "n0", CPUMilli: 64000, MemoryMiB: 262144, GPUs: 2, Model: "P100"}, {Name: "n1", CPUMilli: 32000, MemoryMiB: 262144}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseNodes() = %+v, want %+v", got, want)
	}
}

func TestTraceErrors(t *testing.T) {
	const podHeader = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
	const nodeHeader = "sn,cpu_milli,memory_mib,gpu,model\n"
	tests := []struct {
		name  string
		nodes bool
		in    string
		want  string
	}{
		{"empty", false, "", "pods.csv:1: empty file; want a header with name,cpu_milli,memory_mib,num_gpu,gpu_milli"},
		{"missing column", false, "name,cpu_milli,memory_mib,num_gpu\n", `pods.csv:1: header lacks column "gpu_milli"`},
		{"duplicate column", false, "name,name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "pods.csv:1:2 (column name): column appears twice"},
		{"not a number", false, podHeader + "p0,1,2,1,1000\np1,abc,2,1,1000\n", `pods.csv:3:2 (column cpu_milli): want an integer, got "abc"`},
		{"negative", false, podHeader + "p0,1,-2,1,1000\n", "pods.csv:2:3 (column memory_mib): want 0..1099511627776, got -2"},
		{"too many gpus", false, podHeader + "p0,1,2,65,1000\n", "pods.csv:2:4 (column num_gpu): want 0..64, got 65"},
		{"gpus without share", false, podHeader + "p0,1,2,1,0\n", "pods.csv:2:5 (column gpu_milli): a pod with 1 GPUs needs gpu_milli 1..1000"},
		{"shared multi-gpu", false, podHeader + "p0,1,2,2,500\n", "pods.csv:2:5 (column gpu_milli): a pod with 2 GPUs must take them whole"},
		{"short line", false, podHeader + "p0,1,2,1\n", "pods.csv:2:1: wrong number of fields"},
		{"bad quote", false, podHeader + "p0,\"1,2,1,1000\n", "pods.csv:2:"},
		{"empty name", false, podHeader + ",1,2,1,1000\n", "pods.csv:2:1 (column name): the pod name is empty"},
		{"duplicate node", true, nodeHeader + "n0,1,2,1,T4\nn0,1,2,1,T4\n", `nodes.csv:3:1 (column sn): node "n0" is also on line 2`},
		{"gpu node without model", true, nodeHeader + "n0,1,2,4,\n", "nodes.csv:2:5 (column model): a node with 4 GPUs needs a model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.nodes {
				_, err = ParseNodes("nodes.csv", strings.NewReader(tt.in))
			} else {
				_, err = ParsePods("pods.csv", strings.NewReader(tt.in))
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error = %v, want ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %q\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

func FuzzParsePods(f *testing.F) {
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,12000,16384,1,460,T4|P100\n")
	f.Add("gpu_milli,num_gpu,memory_mib,cpu_milli,name\n1000,8,1,1,x\n")
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n\"p\"\"0\",1,2,1,99999999999\n")
	f.Fuzz(func(t *testing.T, in string) {
		pods, err := ParsePods("fuzz.csv", strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		for _, p := range pods {
			if p.Name == "" || p.NumGPU < 0 || p.NumGPU > maxTraceGPUs || p.GPUMilli < 0 || p.GPUMilli > 1000 ||
				(p.NumGPU > 0) != (p.GPUMilli > 0) || (p.NumGPU > 1 && p.GPUMilli != 1000) {
				t.Fatalf("accepted an invalid pod %+v", p)
			}
		}
	})
}

func FuzzParseNodes(f *testing.F) {
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n")
	f.Add("model,gpu,memory_mib,cpu_milli,sn\nT4,1,1,1,n\n")
	f.Fuzz(func(t *testing.T, in string) {
		nodes, err := ParseNodes("fuzz.csv", strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, n := range nodes {
			if n.Name == "" || seen[n.Name] || n.GPUs < 0 || n.GPUs > maxTraceGPUs || (n.GPUs > 0 && n.Model == "") {
				t.Fatalf("accepted an invalid node %+v", n)
			}
			seen[n.Name] = true
		}
	})
}
