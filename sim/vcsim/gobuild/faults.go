package main

// Named vSphere faults the control API can inject. Each name is the fault's vmodl type as
// clients see it (pyVmomi raises vim.fault.<Name> / vmodl.fault.<Name>).

import (
	"sort"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

type faultMaker func(m *simulator.Method, message string) types.BaseMethodFault

func withMessage(f *types.MethodFault, message string) {
	if message != "" {
		f.FaultMessage = []types.LocalizableMessage{{Key: "agentforge.vcsim.injected", Message: message}}
	}
}

var faultMakers = map[string]faultMaker{
	"SystemError": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.SystemError{Reason: orDefault(msg, "injected system error")}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"RuntimeFault": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.RuntimeFault{}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"InvalidState": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.InvalidState{}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"InvalidPowerState": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.InvalidPowerState{ExistingState: types.VirtualMachinePowerStatePoweredOff}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"TaskInProgress": func(m *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.TaskInProgress{Task: types.ManagedObjectReference{Type: "Task", Value: "task-busy"}}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"NotAuthenticated": func(m *simulator.Method, msg string) types.BaseMethodFault {
		return notAuthenticated(m.This, msg)
	},
	"NoPermission": func(m *simulator.Method, msg string) types.BaseMethodFault {
		this := m.This
		f := &types.NoPermission{Object: &this, PrivilegeId: "System.Modify"}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"InvalidArgument": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.InvalidArgument{InvalidProperty: "injected"}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"NotSupported": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.NotSupported{}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"NotFound": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.NotFound{}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"ManagedObjectNotFound": func(m *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.ManagedObjectNotFound{Obj: m.This}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"ResourceInUse": func(m *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.ResourceInUse{Type: m.This.Type, Name: m.This.Value}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"InsufficientResourcesFault": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.InsufficientResourcesFault{}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"DuplicateName": func(m *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.DuplicateName{Name: orDefault(msg, "injected"), Object: m.This}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"FileNotFound": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.FileNotFound{FileFault: types.FileFault{File: orDefault(msg, "injected")}}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"FileAlreadyExists": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.FileAlreadyExists{FileFault: types.FileFault{File: orDefault(msg, "injected")}}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"CannotCreateFile": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.CannotCreateFile{FileFault: types.FileFault{File: orDefault(msg, "injected")}}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"GenericVmConfigFault": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.GenericVmConfigFault{Reason: orDefault(msg, "injected")}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"HostCommunication": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.HostCommunication{}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"Timedout": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.Timedout{}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"RequestCanceled": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.RequestCanceled{}
		withMessage(&f.MethodFault, msg)
		return f
	},
	"InvalidLogin": func(_ *simulator.Method, msg string) types.BaseMethodFault {
		f := &types.InvalidLogin{}
		withMessage(&f.MethodFault, msg)
		return f
	},
}

func notAuthenticated(this types.ManagedObjectReference, msg string) *types.NotAuthenticated {
	f := &types.NotAuthenticated{NoPermission: types.NoPermission{Object: &this, PrivilegeId: "System.View"}}
	withMessage(&f.MethodFault, msg)
	return f
}

func faultNames() []string {
	names := make([]string, 0, len(faultMakers))
	for name := range faultMakers {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// localized wraps a fault the way the simulator reports a failed task's info.error.
func localized(f types.BaseMethodFault, message string) *types.LocalizedMethodFault {
	return &types.LocalizedMethodFault{Fault: f, LocalizedMessage: message}
}
