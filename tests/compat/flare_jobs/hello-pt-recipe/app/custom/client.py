"""A Client API script in the shape of FLARE 2.9's hello-pt (written for atoll's tests): trains
SimpleNetwork on synthetic images, logs its loss with FLARE's SummaryWriter, answers validate
tasks with its accuracy (the recipe's cross-site evaluation)."""

import argparse

# (1) import nvflare client API
import nvflare.client as flare
import torch
from model import SimpleNetwork
from nvflare.client.tracking import SummaryWriter
from torch import nn
from torch.optim import SGD
from torch.utils.data import DataLoader, TensorDataset


def synthetic_set(size, seed):
    # stands in for torchvision.datasets.FakeData: no download on the test machine
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (size,), generator=generator)
    return TensorDataset(images, labels)


def evaluate(net, data_loader, device):
    correct = 0
    total = 0
    # since we're not training, we don't need to calculate the gradients for our outputs
    with torch.no_grad():
        for data in data_loader:
            images, labels = data[0].to(device), data[1].to(device)
            outputs = net(images)
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()

        accuracy = 100 * correct // total
        print(f"Accuracy of the network on {total} test images: {accuracy} %")
    return accuracy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--train_size", type=int, default=50000)
    parser.add_argument("--test_size", type=int, default=10000)
    args = parser.parse_args()
    epochs = args.epochs
    lr = 0.01
    model = SimpleNetwork()
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    loss = nn.CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=lr, momentum=0.9)

    train_loader = DataLoader(synthetic_set(args.train_size, 0), batch_size=args.batch_size,
                              shuffle=True, num_workers=args.num_workers)
    test_loader = DataLoader(synthetic_set(args.test_size, 1), batch_size=args.batch_size,
                             shuffle=False, num_workers=args.num_workers)

    # (3) initializes NVFlare client API
    flare.init()
    sys_info = flare.system_info()
    client_name = sys_info["site_name"]
    last_params = None
    writer = SummaryWriter()

    while flare.is_running():
        # (4) receives FLModel from NVFlare
        input_model = flare.receive()
        print(f"site = {client_name}, current_round={input_model.current_round}")

        if flare.is_submit_model():
            if last_params is None:
                raise RuntimeError("submit_model called before a local model was trained")
            flare.send(flare.FLModel(params=last_params))
            continue

        # (5) loads model from NVFlare
        model.load_state_dict(input_model.params)
        model.to(device)
        # (6) evaluate on received model for model selection
        accuracy = evaluate(model, test_loader, device)

        if flare.is_evaluate():
            output_model = flare.FLModel(metrics={"accuracy": accuracy})
            flare.send(output_model)
            continue

        steps = epochs * len(train_loader)
        for epoch in range(epochs):
            running_loss = 0.0
            for _i, batch in enumerate(train_loader):
                images, labels = batch[0].to(device), batch[1].to(device)
                optimizer.zero_grad()

                predictions = model(images)
                cost = loss(predictions, labels)
                cost.backward()
                optimizer.step()

                running_loss += cost.item()
            step = input_model.current_round * epochs + epoch
            writer.add_scalar("train_loss", running_loss / len(train_loader), global_step=step)

        print(f"Finished Training for {client_name}")

        last_params = {name: param.detach().cpu().clone() for name, param in model.state_dict().items()}

        # (7) construct trained FL model
        output_model = flare.FLModel(
            params=last_params,
            metrics={"accuracy": accuracy},
            meta={"NUM_STEPS_CURRENT_ROUND": steps},
        )
        print(f"site: {client_name}, sending model to server.")
        # (8) send model back to NVFlare
        flare.send(output_model)


if __name__ == "__main__":
    main()
