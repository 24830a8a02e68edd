# shellcheck shell=sh
# One request from the accelerator machine to the storage machine's
# target: "ping", "port-off N" (the subsystem taken off port N, whose
# connections then fail) or "port-on N"; answers "ok" or "error ...".
nqn=$(cat /suite/fabric/subnqn)
n=/sys/kernel/config/nvmet
read -r what port
case $what in
ping) echo ok ;;
port-off)
	if rm "$n/ports/$port/subsystems/$nqn"; then echo ok; else echo "error: port $port"; fi
	echo "@@TARGET port $port off" >/dev/console
	;;
port-on)
	if ln -s "$n/subsystems/$nqn" "$n/ports/$port/subsystems/$nqn"; then echo ok; else echo "error: port $port"; fi
	echo "@@TARGET port $port on" >/dev/console
	;;
*) echo "error: unknown request $what" ;;
esac
