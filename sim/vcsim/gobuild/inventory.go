package main

// The inventory agent-forge's tests and demo rely on. Names matter and are part of the
// contract (docs/design/0001-plan-and-contracts.md): datacenter dc1, cluster "cluster"
// (resource pool cluster/Resources) with hosts, datastores ds1 and ds2 inside the datastore
// cluster dsc1 with Storage DRS enabled, a separate ISO datastore iso-ds, the standard port
// group "VM Network" and the distributed port group dvpg1. It is built through the
// simulator's own SOAP methods (an in-process client), so it is exactly what a vCenter
// would hold after the same calls.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/units"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/types"
)

type inventorySpec struct {
	Datacenters     int
	Clusters        int
	Hosts           int
	PodDatastores   int
	LooseDatastores int
	PodName         string
	SDRS            bool
	ISODatastore    string
	Portgroups      int
	DVPortgroups    int
	Folders         int
	VMs             int
}

func (s inventorySpec) validate() error {
	switch {
	case s.Datacenters < 1:
		return errors.New("-datacenters must be at least 1")
	case s.Clusters < 1:
		return errors.New("-clusters must be at least 1")
	case s.Hosts < 1:
		return errors.New("-hosts must be at least 1")
	case s.PodDatastores < 0 || s.LooseDatastores < 0 || s.Portgroups < 0 || s.DVPortgroups < 0 || s.Folders < 0 || s.VMs < 0:
		return errors.New("counts cannot be negative")
	case s.PodName != "" && s.PodDatastores < 1:
		return errors.New("a datastore cluster needs at least one datastore (-datastores)")
	case s.PodName == "" && s.PodDatastores > 0:
		return errors.New("-datastores counts the datastore cluster's datastores; use -loose-datastores without one")
	case s.VMs > 0 && s.PodDatastores+s.LooseDatastores == 0:
		return errors.New("-vms needs a datastore")
	}
	return nil
}

func numbered(prefix string, i int) string {
	if i == 1 {
		return prefix
	}
	return fmt.Sprintf("%s%d", prefix, i)
}

// buildInventory creates the inventory described by spec; datastore contents live under root.
func buildInventory(ctx context.Context, model *simulator.Model, spec inventorySpec, root string) error {
	c, err := vim25.NewClient(ctx, model.Service)
	if err != nil {
		return err
	}
	b := &builder{ctx: ctx, c: c, spec: spec, root: root, registry: model.Map()}
	for i := 1; i <= spec.Datacenters; i++ {
		if err := b.datacenter(fmt.Sprintf("dc%d", i)); err != nil {
			return fmt.Errorf("datacenter dc%d: %w", i, err)
		}
	}
	return nil
}

type builder struct {
	ctx      context.Context
	c        *vim25.Client
	spec     inventorySpec
	root     string
	registry *simulator.Registry
}

func (b *builder) wait(task *object.Task, err error) (types.AnyType, error) {
	if err != nil {
		return nil, err
	}
	info, err := task.WaitForResult(b.ctx)
	if err != nil {
		return nil, err
	}
	return info.Result, nil
}

func (b *builder) datacenter(name string) error {
	ctx := b.ctx
	dc, err := object.NewRootFolder(b.c).CreateDatacenter(ctx, name)
	if err != nil {
		return err
	}
	folders, err := dc.Folders(ctx)
	if err != nil {
		return err
	}
	for i := 1; i <= b.spec.Folders; i++ {
		if _, err := folders.VmFolder.CreateFolder(ctx, fmt.Sprintf("folder%d", i)); err != nil {
			return err
		}
	}

	var hosts []*object.HostSystem
	var pools []*object.ResourcePool
	hostN := 0
	for i := 1; i <= b.spec.Clusters; i++ {
		cluster, err := folders.HostFolder.CreateCluster(ctx, numbered("cluster", i), types.ClusterConfigSpecEx{})
		if err != nil {
			return err
		}
		for j := 0; j < b.spec.Hosts; j++ {
			hostN++
			spec := types.HostConnectSpec{HostName: fmt.Sprintf("esx%d.%s.vcsim.local", hostN, name)}
			res, err := b.wait(cluster.AddHost(ctx, spec, true, nil, nil))
			if err != nil {
				return fmt.Errorf("add host: %w", err)
			}
			hosts = append(hosts, object.NewHostSystem(b.c, res.(types.ManagedObjectReference)))
		}
		pool, err := cluster.ResourcePool(ctx)
		if err != nil {
			return err
		}
		pools = append(pools, pool)
	}

	// "VM Network" comes with every datacenter; further standard port groups live on vSwitch0
	// of the first host (the simulator keeps one Network entity per name and datacenter).
	for i := 2; i <= b.spec.Portgroups; i++ {
		ns, err := hosts[0].ConfigManager().NetworkSystem(ctx)
		if err != nil {
			return err
		}
		spec := types.HostPortGroupSpec{Name: fmt.Sprintf("VM Network %d", i), VswitchName: "vSwitch0"}
		if err := ns.AddPortGroup(ctx, spec); err != nil {
			return fmt.Errorf("port group %s: %w", spec.Name, err)
		}
	}
	if b.spec.DVPortgroups > 0 {
		if err := b.distributedSwitch(folders.NetworkFolder, hosts); err != nil {
			return err
		}
	}

	var vmDatastore string
	if b.spec.PodName != "" {
		pod, err := folders.DatastoreFolder.CreateStoragePod(ctx, b.spec.PodName)
		if err != nil {
			return err
		}
		var refs []types.ManagedObjectReference
		for i := 1; i <= b.spec.PodDatastores; i++ {
			ds, err := b.localDatastore(name, fmt.Sprintf("ds%d", i), hosts)
			if err != nil {
				return err
			}
			refs = append(refs, ds)
		}
		if _, err := b.wait(pod.MoveInto(ctx, refs)); err != nil {
			return fmt.Errorf("move datastores into %s: %w", b.spec.PodName, err)
		}
		srm := object.NewStorageResourceManager(b.c)
		sdrs := types.StorageDrsConfigSpec{PodConfigSpec: &types.StorageDrsPodConfigSpec{
			Enabled:           types.NewBool(b.spec.SDRS),
			DefaultVmBehavior: string(types.StorageDrsPodConfigInfoBehaviorAutomated),
		}}
		if _, err := b.wait(srm.ConfigureStorageDrsForPod(ctx, pod, sdrs, true)); err != nil {
			return fmt.Errorf("configure Storage DRS: %w", err)
		}
		b.podSummary(pod.Reference(), refs)
		vmDatastore = "ds1"
	}
	for i := 1; i <= b.spec.LooseDatastores; i++ {
		dsName := fmt.Sprintf("local%d", i)
		if _, err := b.localDatastore(name, dsName, hosts); err != nil {
			return err
		}
		if vmDatastore == "" {
			vmDatastore = dsName
		}
	}
	if b.spec.ISODatastore != "" {
		if _, err := b.localDatastore(name, b.spec.ISODatastore, hosts); err != nil {
			return err
		}
	}

	for i := 1; i <= b.spec.VMs; i++ {
		if err := b.virtualMachine(folders.VmFolder, pools[0], fmt.Sprintf("vm%d", i), vmDatastore); err != nil {
			return fmt.Errorf("vm%d: %w", i, err)
		}
	}
	return nil
}

// podSummary fills in the datastore cluster's summary, which the simulator leaves empty:
// its name and the capacity and free space of its datastores at start-up.
func (b *builder) podSummary(ref types.ManagedObjectReference, datastores []types.ManagedObjectReference) {
	ctx := &simulator.Context{Context: b.ctx, Map: b.registry}
	summary := &types.StoragePodSummary{}
	for _, dsRef := range datastores {
		if ds, ok := b.registry.Get(dsRef).(*simulator.Datastore); ok {
			ctx.WithLock(ds, func() {
				summary.Capacity += ds.Summary.Capacity
				summary.FreeSpace += ds.Summary.FreeSpace
			})
		}
	}
	if pod, ok := b.registry.Get(ref).(*simulator.StoragePod); ok {
		ctx.WithLock(pod, func() {
			summary.Name = pod.Name
			ctx.Update(pod, []types.PropertyChange{{Name: "summary", Val: summary}})
		})
	}
}

// localDatastore creates a datastore backed by a real directory, mounted on every host.
func (b *builder) localDatastore(dc, name string, hosts []*object.HostSystem) (types.ManagedObjectReference, error) {
	dir := filepath.Join(b.root, dc, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return types.ManagedObjectReference{}, err
	}
	var ref types.ManagedObjectReference
	for _, host := range hosts {
		dss, err := host.ConfigManager().DatastoreSystem(b.ctx)
		if err != nil {
			return ref, err
		}
		ds, err := dss.CreateLocalDatastore(b.ctx, name, dir)
		if err != nil {
			return ref, fmt.Errorf("datastore %s: %w", name, err)
		}
		if ref.Value == "" {
			// Only the first mount creates the datastore: the simulator answers later mounts
			// of the same name with a reference that is never registered.
			ref = ds.Reference()
		}
	}
	return ref, nil
}

func (b *builder) distributedSwitch(networkFolder *object.Folder, hosts []*object.HostSystem) error {
	ctx := b.ctx
	var members []types.DistributedVirtualSwitchHostMemberConfigSpec
	for _, host := range hosts {
		members = append(members, types.DistributedVirtualSwitchHostMemberConfigSpec{
			Operation: string(types.ConfigSpecOperationAdd),
			Host:      host.Reference(),
		})
	}
	spec := types.DVSCreateSpec{ConfigSpec: &types.VMwareDVSConfigSpec{
		DVSConfigSpec: types.DVSConfigSpec{Name: "dvs1"},
	}}
	res, err := b.wait(networkFolder.CreateDVS(ctx, spec))
	if err != nil {
		return fmt.Errorf("create dvs1: %w", err)
	}
	dvs := object.NewDistributedVirtualSwitch(b.c, res.(types.ManagedObjectReference))
	// The simulator's CreateDVS ignores host members; hosts join by reconfiguring, before
	// the port groups exist so that every port group spans every host.
	if _, err := b.wait(dvs.Reconfigure(ctx, &types.DVSConfigSpec{Host: members})); err != nil {
		return fmt.Errorf("add hosts to dvs1: %w", err)
	}
	var pgs []types.DVPortgroupConfigSpec
	for i := 1; i <= b.spec.DVPortgroups; i++ {
		pgs = append(pgs, types.DVPortgroupConfigSpec{
			Name:     fmt.Sprintf("dvpg%d", i),
			Type:     string(types.DistributedVirtualPortgroupPortgroupTypeEarlyBinding),
			NumPorts: 32,
		})
	}
	if _, err := b.wait(dvs.AddPortgroup(ctx, pgs)); err != nil {
		return fmt.Errorf("add distributed port groups: %w", err)
	}
	return nil
}

// virtualMachine creates a small powered-on VM with a disk, an empty CD-ROM and a vmxnet3
// NIC on "VM Network".
func (b *builder) virtualMachine(folder *object.Folder, pool *object.ResourcePool, name, datastore string) error {
	ctx := b.ctx
	var devices object.VirtualDeviceList
	scsi, err := devices.CreateSCSIController("pvscsi")
	if err != nil {
		return err
	}
	devices = append(devices, scsi)
	ide, err := devices.CreateIDEController()
	if err != nil {
		return err
	}
	devices = append(devices, ide)
	cdrom, err := devices.CreateCdrom(ide.(*types.VirtualIDEController))
	if err != nil {
		return err
	}
	devices = append(devices, cdrom)
	disk := devices.CreateDisk(scsi.(types.BaseVirtualController), types.ManagedObjectReference{},
		fmt.Sprintf("[%s] %s/%s.vmdk", datastore, name, name))
	disk.CapacityInKB = units.GB / units.KB
	devices = append(devices, disk)
	backing := &types.VirtualEthernetCardNetworkBackingInfo{
		VirtualDeviceDeviceBackingInfo: types.VirtualDeviceDeviceBackingInfo{DeviceName: "VM Network"},
	}
	card, err := devices.CreateEthernetCard("vmxnet3", backing)
	if err != nil {
		return err
	}
	devices = append(devices, card)
	changes, err := devices.ConfigSpec(types.VirtualDeviceConfigSpecOperationAdd)
	if err != nil {
		return err
	}
	config := types.VirtualMachineConfigSpec{
		Name:         name,
		GuestId:      string(types.VirtualMachineGuestOsIdentifierOtherGuest64),
		NumCPUs:      1,
		MemoryMB:     512,
		Files:        &types.VirtualMachineFileInfo{VmPathName: fmt.Sprintf("[%s]", datastore)},
		DeviceChange: changes,
	}
	res, err := b.wait(folder.CreateVM(ctx, config, pool, nil))
	if err != nil {
		return err
	}
	vm := object.NewVirtualMachine(b.c, res.(types.ManagedObjectReference))
	_, err = b.wait(vm.PowerOn(ctx))
	return err
}
